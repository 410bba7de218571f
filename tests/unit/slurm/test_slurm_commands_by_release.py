"""Every argv builder for Slurm 22.05 and 24.11: what changes and what stays byte-identical."""

from __future__ import annotations

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.commands import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SbatchSpec,
    sacct_argv,
    sacct_base_argv,
    sacct_fields,
    sbatch_argv,
    scancel_argv,
    scontrol_show_config_argv,
    scontrol_update_timelimit_argv,
    squeue_argv,
    squeue_observe_argv,
    squeue_state_argv,
    squeue_user_argv,
)
from dagster_slurm.slurm.version import SlurmVersion

V22_05 = SlurmVersion(22, 5, 8)
V24_11 = SlurmVersion(24, 11, 5)
SPEC = SbatchSpec(job_name="dg-a", script_path="/s/job.sh", partition="cpu", time_limit="10",
                  cpus_per_task=2, mem="1G", comment="tok-1", signal="B:TERM@60")


@pytest.mark.parametrize("version", [None, V22_05, V24_11])
def test_builders_whose_options_every_release_has_are_the_same(version: SlurmVersion | None) -> None:
    assert sbatch_argv(SPEC, version=version) == sbatch_argv(SPEC)
    assert sbatch_argv(SPEC, test_only=True, script_on_stdin=True, version=version) == \
        sbatch_argv(SPEC, test_only=True, script_on_stdin=True)
    assert squeue_argv(["a"], ["1"], version=version) == squeue_argv(["a"], ["1"])
    assert squeue_user_argv(version=version) == squeue_user_argv()
    assert squeue_observe_argv(["a"], version=version) == squeue_observe_argv(["a"])
    assert scancel_argv(["1"], signal="TERM", batch_only=True, version=version) == \
        ["scancel", "--batch", "--signal=TERM", "1"]
    assert scontrol_show_config_argv(version=version) == ["scontrol", "show", "config"]
    assert scontrol_update_timelimit_argv("7", "+5", version=version) == \
        ["scontrol", "update", "JobId=7", "TimeLimit=+00:05:00"]


def test_state_poll_on_22_05_is_the_full_listing() -> None:
    expected = ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}", "--states=all", "--name=a,b"]
    assert squeue_state_argv(["a", "b"], ["11", "12"], version=V22_05) == expected
    assert squeue_state_argv(["a", "b"], ["11", "12"], version=None) == expected
    assert squeue_state_argv(["a"], ["11"], version=SlurmVersion(23, 11, 4)) == \
        squeue_argv(["a"])
    assert squeue_state_argv(["a"], ["11"], version=SlurmVersion(26, 5, 0)) == squeue_argv(["a"])


def test_state_poll_on_24_11_asks_only_for_states_by_id() -> None:
    assert squeue_state_argv(["a", "b"], ["11", "12", "11"], version=V24_11) == [
        "squeue", "--only-job-state", "--format=%i|%T", "--states=all", "--jobs=11,12"]
    with pytest.raises(ConfigurationError):
        squeue_state_argv(["a"], [], version=V24_11)
    with pytest.raises(ConfigurationError):
        squeue_state_argv(["a"], ["1;rm"], version=V24_11)


def test_sacct_on_22_05_is_unchanged_and_24_11_adds_planned_last() -> None:
    columns = ",".join(SACCT_FIELDS)
    assert sacct_argv(["3", "4"], version=V22_05) == sacct_argv(["3", "4"]) == [
        "sacct", "--parsable2", "--noheader", f"--format={columns}", "--jobs=3,4"]
    assert sacct_base_argv(version=V22_05) == sacct_base_argv()
    assert sacct_fields(V22_05) == sacct_fields(None) == SACCT_FIELDS
    assert sacct_fields(V24_11) == (*SACCT_FIELDS, "Planned")
    assert sacct_argv(["3"], version=V24_11) == [
        "sacct", "--parsable2", "--noheader", f"--format={columns},Planned", "--jobs=3"]
    assert sacct_base_argv(version=V24_11) == sacct_argv(["3"], version=V24_11)[:-1]
