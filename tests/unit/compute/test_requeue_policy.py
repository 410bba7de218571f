"""The requeue policy and what a step says when its job or allocation lost a node (pure)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dagster_slurm import SlurmQueueConfig, SlurmRunAllocationConfig
from dagster_slurm.jobs.errors import JobOutcome, SlurmJobRequeued, SlurmNodeFailure
from dagster_slurm.jobs.outcome import outcome_error
from dagster_slurm.jobs.pending import PendingPolicy, PendingTracker
from dagster_slurm.protocol import REQUEUE_REFUSAL, REQUEUED_STATUS
from dagster_slurm.scheduler.client import JobObservation
from dagster_slurm.session.core.allocation import gone_state
from dagster_slurm.session.core.errors import (
    REQUEUED,
    SlurmAllocationEnded,
    SlurmAllocationNodeFailure,
    SlurmStepExecutionResult,
    allocation_ended,
)
from dagster_slurm.slurm.commands import sbatch_argv
from dagster_slurm.slurm.states import JobState


# -- the policy ----------------------------------------------------------------------------
def test_asset_jobs_are_not_requeued_unless_asked() -> None:
    assert "--no-requeue" in sbatch_argv(SlurmQueueConfig().to_sbatch_spec("j", "/s"))
    asked = SlurmQueueConfig(requeue=True).to_sbatch_spec("j", "/s")
    assert asked.requeue and "--requeue" in sbatch_argv(asked)


def test_requeue_in_extra_directives_names_the_field() -> None:
    with pytest.raises(Exception, match="first-class field requeue") as error:
        SlurmQueueConfig(extra_sbatch_directives=["--requeue"])
    assert "extra_sbatch_directives[0]='--requeue'" in str(error.value)


def test_run_allocations_are_never_requeued_even_from_a_requeue_queue() -> None:
    queue = SlurmRunAllocationConfig().queue_for(SlurmQueueConfig(requeue=True))
    assert queue.requeue is False
    assert "--no-requeue" in sbatch_argv(queue.to_sbatch_spec("dsr-x", "/s"))


# -- asset scope ---------------------------------------------------------------------------
def test_a_node_failure_names_the_node() -> None:
    error = outcome_error(JobState.NODE_FAIL, JobOutcome("9", "NODE_FAIL", None, nodes=("c1",)))
    assert isinstance(error, SlurmNodeFailure)
    assert "(job 9, state NODE_FAIL, on c1)" in str(error)


@pytest.mark.parametrize("code", [REQUEUED_STATUS, 143, None])
def test_a_refused_second_start_is_a_requeue_whatever_the_status(code) -> None:
    stderr = f"dagster-slurm: Slurm started this job a second time, now on c1; {REQUEUE_REFUSAL}"
    error = outcome_error(JobState.FAILED, JobOutcome("9", "FAILED", code, "", stderr))
    assert isinstance(error, SlurmJobRequeued)
    assert "requeue=True" in str(error) and "second time" in str(error)


def _observation(state: JobState, reason: str | None = None, nodes: tuple[str, ...] = ()):
    queue = SimpleNamespace(nodes=nodes)
    return JobObservation("9", state, reason, queue=queue)  # type: ignore[arg-type]


def test_the_tracker_says_at_once_when_a_running_job_is_back_in_the_queue() -> None:
    lines: list[str] = []
    warnings: list[str] = []
    tracker = PendingTracker("9", PendingPolicy(fatal_reasons={}), lines.append,
                             warn=warnings.append, requeue_note="the payload starts again")
    tracker(_observation(JobState.PENDING, "Priority"))
    tracker(_observation(JobState.RUNNING, nodes=("c1",)))
    assert not warnings
    tracker(_observation(JobState.PENDING, "BeginTime"))
    assert warnings == ["Slurm requeued job 9: it ran on c1 and is back in the queue as "
                        "PENDING (reason BeginTime); the payload starts again"]
    tracker(_observation(JobState.PENDING, "BeginTime"))
    assert len(warnings) == 1 and tracker.restarts == 1
    tracker(_observation(JobState.RUNNING, nodes=("c2",)))
    assert lines[-1] == "Slurm job 9 is RUNNING on c2 again (start 2)"


# -- run scope -----------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["NODE_FAIL", "BOOT_FAIL", REQUEUED])
def test_a_lost_node_under_a_step_is_a_node_failure_naming_the_nodes(state) -> None:
    result = SlurmStepExecutionResult("42", "step", None, allocation_state=state,
                                      nodes=("c1", "c2"))
    error = allocation_ended(result, "allocation 42 ended")
    assert isinstance(error, SlurmAllocationNodeFailure)
    assert isinstance(error, SlurmAllocationEnded) and isinstance(error, SlurmNodeFailure)
    message = str(error)
    assert f"state {state}" in message and "on c1,c2" in message
    assert "not started again" in message and "new allocation" in message
    assert ("cancelled" in message) == (state == REQUEUED)


def test_other_ends_stay_allocation_ended() -> None:
    result = SlurmStepExecutionResult("42", "step", None, allocation_state="TIMEOUT")
    error = allocation_ended(result, "allocation 42 ended")
    assert type(error) is SlurmAllocationEnded


class _Snapshot:
    def __init__(self, state: JobState | None, ended: str | None) -> None:
        self.state, self.ended = state, ended

    def ended_state(self, job_id: str) -> str | None:
        return self.ended

    def job(self, job_id: str) -> JobObservation:
        return JobObservation(job_id, self.state)


@pytest.mark.parametrize(
    ("state", "ended", "expected"),
    [
        (JobState.RUNNING, None, None),
        (JobState.NODE_FAIL, "NODE_FAIL", "NODE_FAIL"),
        (JobState.PENDING, None, REQUEUED),  # a started allocation back in the queue
        (JobState.REQUEUED, None, REQUEUED),
        (None, None, None),  # nothing certain: keep waiting, never an end
    ],
)
def test_gone_state_of_a_started_allocation(state, ended, expected) -> None:
    assert gone_state(_Snapshot(state, ended), "42") == expected
