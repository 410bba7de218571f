"""Packed and pre-deployed environments on the dev cluster, over SSH.

Every test works under its own ``<base>/test-env/<id>`` on the cluster and removes it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_slurm import SlurmResource
from dagster_slurm.agent.ops import exec_op, remove_op
from dagster_slurm.agent.results import ExecResult
from dagster_slurm.environment import (
    EnvironmentConfig,
    EnvironmentHandle,
    clear_process_cache,
    prepare_environment,
)
from dagster_slurm.errors import ConfigurationError

pytestmark = pytest.mark.integration
log = logging.getLogger("test.environment")


@pytest.fixture
def slurm(slurm_cluster) -> SlurmResource:
    return SlurmResource.from_env(environ=slurm_cluster.env())


@pytest.fixture
def remote_base(slurm: SlurmResource) -> Iterator[str]:
    base = f"{slurm.base_path()}/test-env/{uuid.uuid4().hex[:12]}"
    clear_process_cache()
    yield base
    clear_process_cache()
    slurm.agent().run(remove_op(base, root=slurm.base_path()))


def in_env(
    slurm: SlurmResource, handle: EnvironmentHandle, code: str, *, srun: bool = False
) -> ExecResult:
    """Run ``python -c code`` after sourcing the environment (on a compute node with srun)."""
    argv = ["bash", "-c", '. "$1" && exec python -c "$2"', "bash", handle.activation_script, code]
    if srun:
        argv = [
            "srun",
            "--partition",
            slurm.queue.partition or "cpu",
            "--nodes",
            "1",
            "--time",
            "2",
            *argv,
        ]
    return slurm.agent().run(exec_op(argv, timeout=120))


def test_packed_dagster_pipes_env_runs_payload_code_and_is_reused(
    slurm, remote_base, tmp_path: Path
):
    config = EnvironmentConfig(
        env_packages=["dagster-pipes"], env_cache_dir=str(tmp_path / "cache")
    )
    first = prepare_environment(slurm.agent(), remote_base, config, logger=log)
    assert first.kind == "wheelhouse" and not first.reused and first.uploaded_bytes > 0
    assert first.activation_script == f"{remote_base}/envs/{first.env_hash}/activate.sh"

    probe = "import dagster_pipes, sys; print(sys.prefix); dagster_pipes.open_dagster_pipes"
    result = in_env(slurm, first, probe)
    assert result.ok, result.stderr
    assert result.stdout.strip().startswith(f"{remote_base}/envs/.builds/{first.env_hash}.")
    on_node = in_env(slurm, first, "import dagster_pipes", srun=True)
    assert on_node.ok, on_node.stderr

    transport = slurm.agent().transport
    again = prepare_environment(slurm.agent(), remote_base, config)
    assert again.reused and again.uploaded_bytes == 0

    clear_process_cache()
    before = transport.stats.round_trips
    second = prepare_environment(slurm.agent(), remote_base, config, logger=log)
    assert second.reused and second.uploaded_bytes == 0 and second.env_hash == first.env_hash
    assert transport.stats.round_trips - before == 2, "platform probe and ready check only"
    log.info("dagster-pipes env: first %s; reuse %s", first.timings, second.timings)


def test_a_changed_package_set_uploads_only_the_new_wheels(slurm, remote_base, tmp_path: Path):
    cache = str(tmp_path / "cache")
    small = prepare_environment(
        slurm.agent(),
        remote_base,
        EnvironmentConfig(env_packages=["dagster-pipes"], env_cache_dir=cache),
    )
    bigger = prepare_environment(
        slurm.agent(),
        remote_base,
        EnvironmentConfig(env_packages=["dagster-pipes", "six"], env_cache_dir=cache),
    )
    assert bigger.env_hash != small.env_hash and not bigger.reused
    assert 0 < bigger.uploaded_bytes < small.uploaded_bytes / 2, (
        "pip and dagster-pipes come from the store"
    )
    assert in_env(slurm, bigger, "import six, dagster_pipes").ok


PREPARE_IN_A_PROCESS = """
import json, sys
from dagster_slurm import SlurmResource
from dagster_slurm.environment import EnvironmentConfig, prepare_environment
base, cache = sys.argv[1:]
slurm = SlurmResource.from_env()
config = EnvironmentConfig(env_packages=["dagster-pipes", "six"], env_cache_dir=cache)
handle = prepare_environment(slurm.agent(), base, config)
print(json.dumps([handle.activation_script, handle.uploaded_bytes, handle.reused]))
"""


def test_concurrent_step_processes_build_once(slurm_cluster, remote_base, tmp_path: Path):
    env = {**os.environ, **slurm_cluster.env()}
    argv = [sys.executable, "-c", PREPARE_IN_A_PROCESS, remote_base, str(tmp_path / "cache")]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    assert len({activation for activation, _, _ in outcomes}) == 1
    assert sorted(reused for _, _, reused in outcomes) == [False, True, True]
    assert sum(1 for _, sent, _ in outcomes if sent) == 1


def test_pre_deployed_env_missing_is_a_clear_error(slurm, remote_base):
    missing = f"{remote_base}/no-such-env"
    with pytest.raises(ConfigurationError) as caught:
        prepare_environment(
            slurm.agent(), remote_base, EnvironmentConfig(pre_deployed_env_path=missing)
        )
    message = str(caught.value)
    assert "pre_deployed_env_path" in message and missing in message
    assert "activate.sh" in message and "bin/activate" in message


def test_pre_deployed_env_pointing_to_a_packed_or_plain_venv_works(
    slurm, remote_base, tmp_path: Path
):
    config = EnvironmentConfig(
        env_packages=["dagster-pipes"], env_cache_dir=str(tmp_path / "cache")
    )
    packed = prepare_environment(slurm.agent(), remote_base, config)
    build = packed.env_dir
    for path, expected in (
        (build, f"{build}/activate.sh"),
        (f"{build}/venv", f"{build}/venv/bin/activate"),
    ):
        handle = prepare_environment(
            slurm.agent(), remote_base, EnvironmentConfig(pre_deployed_env_path=path)
        )
        assert handle.kind == "pre_deployed" and handle.activation_script == expected
        assert handle.uploaded_bytes == 0 and handle.env_hash is None
        result = in_env(slurm, handle, "import dagster_pipes")
        assert result.ok, result.stderr


@pytest.mark.slow
def test_current_environment_is_packed_installed_and_reused(slurm, remote_base, tmp_path: Path):
    """Packs this whole environment (~100 wheels, ~125 MB). Measured here: cold pack ~20 s
    (downloads), upload ~1 s, remote install ~16 s; reuse ~0.1 s."""
    config = EnvironmentConfig(env_cache_dir=str(tmp_path / "cache"))
    start = time.monotonic()
    first = prepare_environment(slurm.agent(), remote_base, config, logger=log)
    elapsed = time.monotonic() - start
    log.info(
        "current environment: %.1f s, %.1f MB, %s",
        elapsed,
        first.uploaded_bytes / 1e6,
        first.timings,
    )
    print(
        f"\ncurrent environment: {elapsed:.1f} s total, {first.uploaded_bytes / 1e6:.1f} MB, {first.timings}"
    )
    code = "import dagster, dagster_pipes, dagster_slurm, paramiko; print(dagster.__version__)"
    result = in_env(slurm, first, code)
    assert result.ok, result.stderr
    assert not in_env(slurm, first, "import pytest").ok, "test tools are left out"

    clear_process_cache()
    second = prepare_environment(slurm.agent(), remote_base, config, logger=log)
    print(f"reuse: {second.timings}")
    # Equal unless the project's sources changed in between (its wheel is rebuilt then).
    if second.env_hash == first.env_hash:
        assert second.reused and second.uploaded_bytes == 0
    else:
        assert second.uploaded_bytes < first.uploaded_bytes / 10
