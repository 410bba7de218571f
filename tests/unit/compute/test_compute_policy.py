"""Pure parts of the compute layer: pending reports, outcomes, overrides, paths, metrics."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from dagster_slurm.compute.options import sbatch_overrides
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.errors import (
    JobOutcome,
    SlurmJobCancelled,
    SlurmJobLost,
    SlurmJobNonZeroExit,
    SlurmJobOutOfMemory,
    SlurmJobPreempted,
    SlurmJobTimeout,
    SlurmNodeFailure,
)
from dagster_slurm.jobs.metrics import METADATA_KEYS, from_local, from_sacct
from dagster_slurm.jobs.outcome import outcome_error
from dagster_slurm.jobs.paths import InvocationPaths, job_name_for, safe_name
from dagster_slurm.jobs.pending import DEFAULT_FATAL_REASONS, explain_pending
from dagster_slurm.slurm.states import JobState


def test_pending_report_names_reason_and_estimate():
    now = datetime(2026, 1, 1, 12, 0, 0)
    report = explain_pending("7", "Resources", now + timedelta(minutes=5), now=now)
    assert "reason Resources" in report.message and "2026-01-01 12:05:00" in report.message
    assert "in 5 min" in report.message and not report.fatal


def test_pending_without_estimate_and_fatal_reasons():
    report = explain_pending("7", "PartitionTimeLimit", None)
    assert report.fatal and "time_limit" in (report.advice or "")
    assert "no start estimate" in report.message
    assert not explain_pending("7", "Priority", None).fatal
    assert not explain_pending("7", "PartitionTimeLimit", None, fatal_reasons={}).fatal
    assert explain_pending("7", "ReqNodeNotAvail, UnavailableNodes:c1", None).fatal
    assert set(DEFAULT_FATAL_REASONS) >= {"InvalidAccount", "InvalidQOS", "PartitionNodeLimit"}


@pytest.mark.parametrize(
    ("state", "code", "stderr", "expected"),
    [
        (JobState.COMPLETED, 0, "", None),
        (JobState.FAILED, 3, "", SlurmJobNonZeroExit),
        (JobState.COMPLETED, 2, "", SlurmJobNonZeroExit),
        (JobState.TIMEOUT, None, "", SlurmJobTimeout),
        (JobState.TIMEOUT, 143, "", SlurmJobTimeout),
        (JobState.OUT_OF_MEMORY, 137, "", SlurmJobOutOfMemory),
        (JobState.FAILED, None, "slurmstepd: error: Exceeded job memory limit", SlurmJobOutOfMemory),
        (JobState.NODE_FAIL, None, "", SlurmNodeFailure),
        (JobState.CANCELLED, None, "", SlurmJobCancelled),
        (None, None, "", SlurmJobLost),
        (None, 0, "", SlurmJobLost),  # unknown is never success, whatever the status file says
        (None, 4, "", SlurmJobNonZeroExit),
    ],
)
def test_outcome_classification(state, code, stderr, expected):
    error = outcome_error(state, JobOutcome("9", state.value if state else None, code, "", stderr))
    assert (error is None) if expected is None else isinstance(error, expected)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (JobState.CANCELLED, SlurmJobCancelled),
        (JobState.TIMEOUT, SlurmJobTimeout),
        (JobState.PREEMPTED, SlurmJobPreempted),
        (JobState.DEADLINE, SlurmJobPreempted),
    ],
)
def test_scheduler_state_wins_over_a_drained_status_file_with_exit_zero(state, expected):
    # the job script recorded a drain and exit 0 (TERM before the payload started)
    outcome = JobOutcome("9", state.value, 0, "", "dagster-slurm: drain signal TERM received")
    assert isinstance(outcome_error(state, outcome), expected)


@pytest.mark.parametrize("state", [None, JobState.UNKNOWN])
def test_unknown_state_with_exit_zero_is_an_error_saying_the_state_is_unknown(state):
    error = outcome_error(state, JobOutcome("9", None, 0))
    assert isinstance(error, SlurmJobLost)
    assert "final state is unknown" in str(error) and "not taken as success" in str(error)


def test_error_message_carries_tails():
    error = outcome_error(JobState.FAILED, JobOutcome("9", "FAILED", 3, "out line", "Traceback: boom"))
    assert "exit code 3" in str(error) and "Traceback: boom" in str(error) and "out line" in str(error)


def test_overrides_map_user_keys_and_reject_unknown_ones():
    assert sbatch_overrides({"nodes": 2, "cpus_per_task": 4, "time_limit": "00:10:00"}) == {
        "num_nodes": 2, "cpus_per_task": 4, "time_limit": "00:10:00"}
    with pytest.raises(ConfigurationError, match="extra_slurm_opts\\['gpu'\\]"):
        sbatch_overrides({"gpu": 1})
    with pytest.raises(ConfigurationError, match="already set"):
        sbatch_overrides({"nodes": 1, "num_nodes": 2})


def test_paths_and_job_names_are_safe():
    paths = InvocationPaths.create("/base/", "run-1", "my asset; rm -rf /", "inv")
    assert paths.job_dir == "/base/runs/run-1/my-asset-rm--rf/inv"
    assert job_name_for("0123456789", "a/b c") == "dsl-01234567-a-b-c"
    assert safe_name("...") == "step"


def test_metrics_have_identical_keys_in_both_modes():
    local = from_local("local-1", 0, 1.5, 0.75, 2048).as_metadata()
    slurm = from_sacct("5", None, 0, "COMPLETED").as_metadata()
    assert set(local) == set(slurm) == set(METADATA_KEYS)
    assert slurm["dagster_slurm/max_rss_mb"] is None and local["dagster_slurm/max_rss_mb"] == 2.0
    assert local["dagster_slurm/cpu_efficiency"] == 0.5
