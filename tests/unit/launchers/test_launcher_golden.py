"""Rendered job scripts pinned by golden files (``UPDATE_GOLDEN=1`` rewrites them)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dagster_slurm.launchers import BashLauncher, ExecutionPlan
from dagster_slurm.launchers.script import ScriptTemplate, load_template, render_template

GOLDEN_DIR = Path(__file__).parent / "golden"

GOLDEN_CASES: dict[str, tuple[BashLauncher, ExecutionPlan]] = {
    "bash_minimal": (
        BashLauncher(),
        ExecutionPlan(
            payload=("python", "/jobs/run-1/payload.py"),
            job_dir="/jobs/run-1",
            status_file="/jobs/run-1/status",
            drain_file="/jobs/run-1/drained",
            mode="local",
        ),
    ),
    "bash_slurm_full": (
        BashLauncher(pre_start_commands=["module load cuda/12.2", 'echo "setup on $(hostname)"']),
        ExecutionPlan(
            payload=("python", "-m", "pkg.module", "--x", "1"),
            job_dir="/scratch/dg/run-7f3a/step-2",
            status_file="/scratch/dg/run-7f3a/step-2/status",
            drain_file="/scratch/dg/run-7f3a/step-2/drained",
            pid_file="/scratch/dg/run-7f3a/step-2/payload.pid",
            mode="slurm",
            num_nodes=2,
            env={
                "DAGSTER_PIPES_CONTEXT": "eyJhIjogMX0=",
                "DAGSTER_PIPES_MESSAGES": "eyJwYXRoIjogIi9zY3JhdGNoIn0=",
                "WANDB_MODE": "offline",
            },
            activation="/scratch/envs/prod/bin/activate",
            drain_signal="SIGUSR1",
            heartbeat_file="/scratch/dg/run-7f3a/step-2/heartbeat",
            heartbeat_timeout=599.5,
        ),
    ),
    "bash_hostile_values": (
        BashLauncher(),
        ExecutionPlan(
            payload=("bash", '/tmp/it\'s a "dir"/payload.sh', "$(reboot)"),
            job_dir='/tmp/it\'s a "dir"',
            status_file='/tmp/it\'s a "dir"/st`id`atus',
            drain_file='/tmp/it\'s a "dir"/drain; rm -rf ~',
            mode="local",
            env={"QUOTES": "a'b\"c", "MULTI": "line1\nline2 $(id)", "EMPTY": ""},
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_script_matches_golden_file(name: str) -> None:
    launcher, plan = GOLDEN_CASES[name]
    rendered = launcher.render(plan)
    path = GOLDEN_DIR / f"{name}.sh"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path} missing; run with UPDATE_GOLDEN=1 to create it"
    assert rendered == path.read_text()


@pytest.mark.parametrize("path", sorted(GOLDEN_DIR.glob("*.sh")), ids=lambda p: p.name)
def test_golden_script_is_valid_bash(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_every_golden_file_has_a_case() -> None:
    assert {path.stem for path in GOLDEN_DIR.glob("*.sh")} == set(GOLDEN_CASES)


def test_script_starts_with_shebang_and_set_u() -> None:
    launcher, plan = GOLDEN_CASES["bash_minimal"]
    lines = launcher.render(plan).splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "set -u" in lines


def test_rendering_is_pure_and_repeatable() -> None:
    launcher, plan = GOLDEN_CASES["bash_slurm_full"]
    assert launcher.render(plan) == launcher.render(plan)


def test_template_placeholders_must_all_be_filled() -> None:
    with pytest.raises(KeyError):
        render_template("bash_launcher.sh", {}, {"prologue": "true"})


def test_template_rejects_unused_values() -> None:
    with pytest.raises(ValueError, match="not used"):
        render_template("bash_launcher.sh", {"pre_start": "", "typo": "x"}, {"prologue": ""})


def test_template_words_are_quoted_and_fragments_are_not() -> None:
    text = render_template("bash_launcher.sh", {"pre_start": "a'b"}, {"prologue": "# p $x"})
    assert text.startswith("# p $x\n")
    assert "__ds_pre_start='a'\"'\"'b'" in text


def test_templates_use_at_placeholders_so_shell_dollars_stay() -> None:
    template = load_template("job_common.sh")
    assert isinstance(template, ScriptTemplate)
    assert '"$__ds_status_file"' in template.template
