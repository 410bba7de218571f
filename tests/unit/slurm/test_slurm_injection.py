"""Values with shell metacharacters either fail validation or reach Slurm literally."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.commands import SbatchSpec, sbatch_argv, scancel_argv, squeue_argv
from dagster_slurm.slurm.directives import validate_extra_sbatch_directives
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.transport.base import render_command


def test_partition_with_a_command_is_rejected() -> None:
    with pytest.raises(ConfigurationError) as caught:
        SbatchSpec(job_name="j", script_path="s", partition="gpu; touch pwned")
    assert caught.value.field == "partition"
    assert caught.value.value == "gpu; touch pwned"
    with pytest.raises(ValidationError, match="partition='gpu; touch pwned'"):
        SlurmQueueConfig(partition="gpu; touch pwned")


def test_wrap_directive_is_rejected() -> None:
    with pytest.raises(ConfigurationError) as caught:
        validate_extra_sbatch_directives(["--wrap=touch /tmp/pwned"])
    assert caught.value.field == "extra_sbatch_directives[0]"
    assert "--wrap" in str(caught.value)


def test_duplicate_time_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="time_limit"):
        SbatchSpec(job_name="j", script_path="s", time_limit="10", extra_directives=("--time=20",))


@pytest.mark.parametrize("name", ["a'b", 'a"b', "a`id`", "$(id)", "a;b", "a b", "a\nb"])
def test_job_names_with_quotes_or_metacharacters_are_rejected(name: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SbatchSpec(job_name=name, script_path="s")
    assert caught.value.field == "job_name"
    with pytest.raises(ConfigurationError):
        squeue_argv([name])
    with pytest.raises(ConfigurationError):
        scancel_argv(job_name=name)


def _echo_through_sh(argv: list[str], cwd: Path) -> list[str]:
    """Run ``printf '%s\\n' <quoted argv>`` with /bin/sh: prints each element as sh saw it."""
    command = "printf '%s\\n' " + shlex.join(argv)
    completed = subprocess.run(
        ["/bin/sh", "-c", command], cwd=cwd, capture_output=True, text=True, check=True
    )
    return completed.stdout.splitlines()


def test_metacharacters_in_allowed_values_reach_slurm_literally(tmp_path: Path) -> None:
    spec = SbatchSpec(
        job_name="dg-run",
        script_path=str(tmp_path / "my job; touch script-pwned.sh"),
        comment="tok $(touch comment-pwned) `touch backtick-pwned` ; touch semi-pwned | cat",
        output=str(tmp_path / "out $(touch output-pwned) %j.log"),
        chdir=str(tmp_path / "dir with 'quotes' and \"double\""),
        extra_directives=("--constraint=a|b&c", "--begin=now+1hour;touch"),
    )
    argv = sbatch_argv(spec)
    assert _echo_through_sh(argv, tmp_path) == argv
    via_transport = subprocess.run(
        ["/bin/sh", "-c", "printf '%s\\n' " + render_command(argv)[len("sbatch ") :]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert via_transport == argv[1:]
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # nothing was executed
    assert (
        "--comment=tok $(touch comment-pwned) `touch backtick-pwned` ; touch semi-pwned | cat"
        in argv
    )


def test_shlex_round_trip_of_every_builder() -> None:
    argvs = [
        sbatch_argv(SbatchSpec(job_name="j", script_path="a b", comment="x'y\"z$HOME")),
        squeue_argv(["j1", "j2"], ["1"]),
        scancel_argv(["1"], job_name="j", signal="USR1"),
    ]
    for argv in argvs:
        assert shlex.split(shlex.join(argv)) == argv
