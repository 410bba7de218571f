"""prepare_environment against a local "cluster": the real agent program over LocalTransport.

The pack is a stand-in pixi self-extracting script (no pip, no network), which exercises
everything around it: the ready check, the build lease, the tar upload, the install batch,
publishing, reuse, waiting, failures and cleanup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.environment.cluster.builder import RemoteBuild
from dagster_slurm.environment.cluster.lease_store import LeaseFileStore
from dagster_slurm.environment.cluster.platform import local_platform
from dagster_slurm.environment.cluster.remote import RemoteLayout
from dagster_slurm.environment.config import EnvironmentConfig
from dagster_slurm.environment.deploy import clear_process_cache, prepare_environment
from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.handle import DeployOptions
from dagster_slurm.environment.packing import pixi
from dagster_slurm.environment.packing.packer import Packers, pack_environment
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.state import lease
from dagster_slurm.transport.local import LocalTransport

UNPACK_SCRIPT = """#!/bin/bash
set -e
out=""; name=env
while [ $# -gt 0 ]; do
  case "$1" in
    --output-directory) out="$2"; shift 2 ;;
    --env-name) name="$2"; shift 2 ;;
    *) shift ;;
  esac
done
sleep "${FAKE_UNPACK_SLEEP:-0}"
[ -z "${FAKE_UNPACK_FAIL:-}" ] || { echo "unpack exploded" >&2; exit 3; }
mkdir -p "$out/$name/bin"
printf 'export FAKE_ENV=%s\\n' "$out/$name" > "$out/activate.sh"
"""
FAST = DeployOptions(poll_interval=0.05, max_poll_interval=0.2, lease_ttl=4.0)


@pytest.fixture(autouse=True)
def _fresh_process_cache():
    clear_process_cache()
    yield
    clear_process_cache()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pixi.toml").write_text('[workspace]\nname = "proj"\n')
    (root / "pixi.lock").write_text("packages:\n- pypi: dagster-pipes\n")
    return root


def fake_pixi_pack(argv):
    out = Path(argv[argv.index("--output-file") + 1])
    out.write_text(UNPACK_SCRIPT + f"# {argv[argv.index('--platform') + 1]}\n")
    return subprocess.CompletedProcess(argv, 0, "", "")


PACKERS = Packers(pixi_run=fake_pixi_pack, which=lambda name: f"/fake/{name}")


@pytest.fixture
def config(tmp_path: Path) -> EnvironmentConfig:
    return EnvironmentConfig(
        env_packer="pixi", auto_detect_platform=False, env_cache_dir=str(tmp_path / "cache")
    )


@pytest.fixture
def base(tmp_path: Path) -> str:
    return str(tmp_path / "cluster")


def new_agent(base: str) -> AgentClient:
    return AgentClient(LocalTransport(default_timeout=60), base, python=sys.executable)


def prepare(agent, base, config, project, **kwargs):
    kwargs.setdefault("options", FAST)
    return prepare_environment(agent, base, config, project_dir=project, packers=PACKERS, **kwargs)


def source(activation: str) -> str:
    out = subprocess.run(
        ["bash", "-c", '. "$1" && echo "$FAKE_ENV"', "bash", activation],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def builds(base: str) -> list[str]:
    return sorted(p.name for p in (Path(base) / "envs" / ".builds").iterdir() if p.is_dir())


def test_first_prepare_builds_and_publishes_then_everything_is_reused(base, config, project):
    agent = new_agent(base)
    handle = prepare(agent, base, config, project)
    assert handle.kind == "pixi" and not handle.reused and handle.uploaded_bytes > 0
    assert handle.env_dir == f"{base}/envs/{handle.env_hash}"
    assert Path(handle.env_dir).is_symlink()
    assert source(handle.activation_script).startswith(f"{base}/envs/.builds/{handle.env_hash}.")
    assert [b for b in builds(base) if not b.endswith(".lock")] == [
        Path(handle.env_dir).resolve().name
    ]
    doc = json.loads(Path(f"{base}/envs/.builds/{handle.env_hash}.lease.json").read_text())
    assert doc["leases"] == {}, "the build lease is released"

    before = agent.transport.stats.round_trips
    again = prepare(agent, base, config, project)
    assert agent.transport.stats.round_trips == before, "same process, same config: no round trip"
    assert again.reused and again.uploaded_bytes == 0 and again.env_hash == handle.env_hash

    clear_process_cache()
    fresh = new_agent(base)
    reused = prepare(fresh, base, config, project)
    assert reused.reused and reused.uploaded_bytes == 0
    assert fresh.transport.stats.round_trips == 1, (
        "one ready check (no probe: platform not detected)"
    )


def test_pre_deployed_environment_is_checked_in_one_round_trip(base, config, project, tmp_path):
    agent = new_agent(base)
    built = prepare(agent, base, config, project)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("export FAKE_ENV=venv\n")
    for path, expected in (
        (built.env_dir, built.activation_script),
        (str(venv), f"{venv}/bin/activate"),
    ):
        clear_process_cache()
        fresh = new_agent(base)
        handle = prepare(fresh, base, EnvironmentConfig(pre_deployed_env_path=path), project)
        assert handle.activation_script == expected and handle.kind == "pre_deployed"
        assert handle.uploaded_bytes == 0 and fresh.transport.stats.round_trips == 1


def test_missing_pre_deployed_environment_names_the_field_and_what_was_looked_for(base, project):
    missing = f"{base}/nowhere"
    with pytest.raises(ConfigurationError) as caught:
        prepare(new_agent(base), base, EnvironmentConfig(pre_deployed_env_path=missing), project)
    assert caught.value.field == "pre_deployed_env_path" and caught.value.value == missing
    assert f"{missing}/activate.sh" in str(caught.value) and f"{missing}/bin/activate" in str(
        caught.value
    )


def test_packer_none_runs_nothing(base, project):
    agent = new_agent(base)
    handle = prepare(agent, base, EnvironmentConfig(env_packer="none"), project)
    assert handle.activation_script is None and agent.transport.stats.round_trips == 0


# The builder renews its lease every quarter of the ttl, each renewal a round trip of the
# agent (a process start): a ttl of 2 s leaves 1.5 s for one, also on a loaded machine.
@pytest.mark.parametrize(
    ("ttl", "build_s"), [(4.0, "1"), (2.0, "4.5")], ids=["short-build", "build-outlives-ttl"]
)
def test_concurrent_preparers_build_once_and_the_others_wait(
    base, config, project, monkeypatch, ttl, build_s
):
    """Also when the build takes longer than the lease's ttl: the builder renews it."""
    monkeypatch.setenv("FAKE_UNPACK_SLEEP", build_s)
    options = DeployOptions(poll_interval=0.05, max_poll_interval=0.2, lease_ttl=ttl)
    handles = []
    errors = []

    def run():
        try:
            handles.append(prepare(new_agent(base), base, config, project, options=options))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sorted(h.reused for h in handles) == [False, True, True]
    assert sum(1 for h in handles if h.uploaded_bytes) == 1
    assert len({h.activation_script for h in handles}) == 1
    assert max(h.timings.wait_s for h in handles) > 0.5
    assert [b for b in builds(base) if not b.endswith(".lock")] == [
        Path(handles[0].env_dir).resolve().name
    ], "no second build was started"


def test_wheelhouse_needs_venv_on_the_cluster(tmp_path: Path):
    import dataclasses

    no_venv = dataclasses.replace(local_platform(), has_venv=False)
    config = EnvironmentConfig(env_packages=["six"], env_cache_dir=str(tmp_path / "c"))
    with pytest.raises(EnvironmentSetupError, match="python3-venv"):
        pack_environment(config, no_venv, local_platform(), tmp_path, PACKERS, _log())


def test_a_failed_install_is_reported_cleaned_up_and_can_be_retried(
    base, config, project, monkeypatch
):
    monkeypatch.setenv("FAKE_UNPACK_FAIL", "1")
    with pytest.raises(EnvironmentSetupError, match="unpack exploded"):
        prepare(new_agent(base), base, config, project)
    assert [b for b in builds(base) if not b.endswith(".lock")] == []
    monkeypatch.delenv("FAKE_UNPACK_FAIL")
    clear_process_cache()
    assert not prepare(new_agent(base), base, config, project).reused


def test_a_dead_builders_lease_expires_and_is_taken_over(base, config, project):
    recipe = pack_environment(config, local_platform(), local_platform(), project, PACKERS, _log())
    layout = RemoteLayout(base, recipe.env_hash)
    agent = new_agent(base)
    store = LeaseFileStore(agent, layout.lease_document, layout.lease_lock)
    assert lease.acquire(store, "build", "ghost:1:dead", 1.0).acquired
    handle = prepare(agent, base, config, project)
    assert not handle.reused and handle.timings.wait_s >= 0.5


def test_a_build_that_loses_the_publish_race_uses_the_winner(base, config, project):
    recipe = pack_environment(config, local_platform(), local_platform(), project, PACKERS, _log())
    layout = RemoteLayout(base, recipe.env_hash)
    winners = []

    class PublishedMeanwhile:
        """The late build's log: once it has uploaded its files (the environment was not
        ready when it began), another build prepares and publishes the environment."""

        def info(self, message, *args):
            if message.startswith("uploaded") and not winners:
                winners.append(prepare(new_agent(base), base, config, project))

        warning = info

    build = RemoteBuild(
        new_agent(base),
        layout,
        recipe,
        python=sys.executable,
        owner="late",
        token="late",
        install_timeout=60,
        log=PublishedMeanwhile(),  # type: ignore[arg-type]
    )
    outcome = build.run(upload_budget=60)
    assert len(winners) == 1 and not winners[0].reused  # the winner built it meanwhile
    assert outcome is not None and not outcome.published and outcome.uploaded_bytes > 0
    assert not os.path.exists(layout.build_dir("late"))
    assert source(winners[0].activation_script)


def _log():
    import logging

    return logging.getLogger("test.environment")


def test_pixi_platform_follows_the_cluster(tmp_path, project, config):
    recipe = pack_environment(config, local_platform(), local_platform(), project, PACKERS, _log())
    assert recipe.kind == pixi.KIND and "linux-64" in recipe.files[0].path.read_text()
