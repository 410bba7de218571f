"""The cluster-side layout, install commands and the shared wheel store program."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dagster_slurm.environment.cluster.remote import (
    PackFile,
    Recipe,
    RemoteLayout,
    install_steps,
    publish_argv,
    ready_content,
    wheel_store_input,
    wheel_store_source,
    wheel_store_step,
)

PYTHON38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"
LAYOUT = RemoteLayout("/home/u/dagster-slurm/", "ab" * 32)
WHEELHOUSE = Recipe(
    "wheelhouse",
    "ab" * 32,
    (PackFile("wheels/pip-24.0-py3-none-any.whl", Path("/c/pip.whl"), "00", shared=True),),
    installer="pip-24.0-py3-none-any.whl",
)


def test_layout_paths():
    assert LAYOUT.envs_dir == "/home/u/dagster-slurm/envs"
    assert LAYOUT.env_dir == f"/home/u/dagster-slurm/envs/{'ab' * 32}"
    assert LAYOUT.activation_script == f"{LAYOUT.env_dir}/activate.sh"
    assert LAYOUT.ready_marker == f"{LAYOUT.env_dir}/.ready"
    assert LAYOUT.build_dir("t1") == f"/home/u/dagster-slurm/envs/.builds/{'ab' * 32}.t1"
    assert LAYOUT.lease_document.endswith(".lease.json") and LAYOUT.lease_lock.endswith(".lock")
    assert LAYOUT.store_dir == "/home/u/dagster-slurm/envs/.wheels"


def test_wheelhouse_install_runs_pip_from_its_wheel_offline_with_hashes():
    build = LAYOUT.build_dir("t1")
    steps = install_steps(WHEELHOUSE, build, "/usr/bin/python3", 900.0)
    assert [s.label for s in steps] == [
        "create the venv",
        "install the wheels",
        "check dependencies",
        "link activate.sh",
    ]
    assert steps[0].argv == ("/usr/bin/python3", "-m", "venv", "--without-pip", f"{build}/venv")
    install = steps[1].argv
    assert install[:3] == (
        f"{build}/venv/bin/python",
        f"{build}/wheels/pip-24.0-py3-none-any.whl/pip",
        "install",
    )
    for flag in ("--no-index", "--no-deps", "--require-hashes", "--no-cache-dir"):
        assert flag in install
    assert install[-2:] == ("-r", f"{build}/requirements.txt")
    assert steps[1].timeout == 900.0 and dict(steps[1].env)["PIP_CONFIG_FILE"] == "/dev/null"
    assert not steps[2].required and steps[3].required
    assert steps[3].argv == ("ln", "-s", "venv/bin/activate", f"{build}/activate.sh")


def test_pixi_install_runs_the_self_extracting_script():
    recipe = Recipe("pixi", "cd" * 32, (PackFile("environment.sh", Path("/c/e.sh"), "11"),))
    [step] = install_steps(recipe, "/b", "python3", 60.0)
    assert step.argv == (
        "bash",
        "/b/environment.sh",
        "--output-directory",
        "/b",
        "--env-name",
        "env",
    )


def test_publishing_is_a_relative_symlink_that_fails_when_taken():
    assert publish_argv(LAYOUT, "t1") == (
        "ln",
        "-s",
        "-n",
        f".builds/{'ab' * 32}.t1",
        LAYOUT.env_dir,
    )
    assert json.loads(ready_content(WHEELHOUSE, "t1", "me"))["build"] == "t1"


def test_recipe_lists_shared_files_for_the_store():
    assert WHEELHOUSE.shared_pairs() == [["00", "pip.whl"]]
    assert WHEELHOUSE.shared_pairs([]) == []


def test_wheel_store_step_runs_the_store_program_without_a_shell():
    pairs = [["aa", "a-1.0-py3-none-any.whl"]]
    step = wheel_store_step("link", LAYOUT, "/b", "/usr/bin/python3", pairs)
    assert step.argv[:3] == ("/usr/bin/python3", "-I", "-c")
    assert step.argv[3] == wheel_store_source()
    assert step.argv[4:] == ("link", LAYOUT.store_dir, "/b/wheels")
    assert json.loads(step.stdin) == pairs and step.required
    assert not wheel_store_step("store", LAYOUT, "/b", "python3", pairs).required


def _store(python: str, mode: str, store: Path, wheels: Path, pairs: list) -> object:
    argv = [python, "-I", "-c", wheel_store_source(), mode, str(store), str(wheels)]
    out = subprocess.run(
        argv, input=wheel_store_input(pairs), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("python", [sys.executable, PYTHON38])
def test_wheel_store_links_what_it_has_and_adds_what_was_uploaded(tmp_path: Path, python: str):
    if not Path(python).exists():
        pytest.skip(f"{python} is not installed")
    store = tmp_path / "envs" / ".wheels"
    first = tmp_path / "b1" / "wheels"
    first.mkdir(parents=True)
    (first / "a-1.0-py3-none-any.whl").write_bytes(b"A")
    pairs = [["aa", "a-1.0-py3-none-any.whl"], ["bb", "b-2.0-py3-none-any.whl"]]
    assert _store(python, "link", store, first, pairs) == pairs
    assert _store(python, "store", store, first, pairs[:1]) == 1
    assert _store(python, "store", store, first, pairs[:1]) == 0
    assert (store / "aa" / "a-1.0-py3-none-any.whl").read_bytes() == b"A"
    second = tmp_path / "b2" / "wheels"
    assert _store(python, "link", store, second, pairs) == [pairs[1]]
    linked = second / "a-1.0-py3-none-any.whl"
    assert linked.is_symlink() and linked.read_bytes() == b"A"


def test_wheel_store_refuses_paths_outside_the_store(tmp_path: Path):
    argv = [
        sys.executable,
        "-I",
        "-c",
        wheel_store_source(),
        "link",
        str(tmp_path / "s"),
        str(tmp_path / "w"),
    ]
    out = subprocess.run(argv, input=json.dumps([["..", "x.whl"]]), capture_output=True, text=True)
    assert out.returncode != 0 and "unsafe" in out.stderr
    out = subprocess.run(
        argv, input=json.dumps([["aa", "../x.whl"]]), capture_output=True, text=True
    )
    assert out.returncode != 0
