"""From a finished job's final state and exit code to success or a typed error (pure)."""

from __future__ import annotations

from dagster_slurm.jobs.errors import (
    JobOutcome,
    SlurmJobCancelled,
    SlurmJobError,
    SlurmJobLost,
    SlurmJobNonZeroExit,
    SlurmJobOutOfMemory,
    SlurmJobPreempted,
    SlurmJobRequeued,
    SlurmJobTimeout,
    SlurmNodeFailure,
)
from dagster_slurm.protocol import REQUEUE_REFUSAL
from dagster_slurm.slurm.states import JobState

_BY_STATE: dict[JobState, type[SlurmJobError]] = {
    JobState.TIMEOUT: SlurmJobTimeout,
    JobState.OUT_OF_MEMORY: SlurmJobOutOfMemory,
    JobState.NODE_FAIL: SlurmNodeFailure,
    JobState.BOOT_FAIL: SlurmNodeFailure,
    JobState.CANCELLED: SlurmJobCancelled,
    JobState.PREEMPTED: SlurmJobPreempted,
    JobState.DEADLINE: SlurmJobPreempted,
    JobState.REVOKED: SlurmJobCancelled,
}


#: slurmstepd's words when it kills a step for exceeding its memory without cgroup OOM
#: accounting (jobacct_gather's OverMemoryKill): the job then ends FAILED, not OUT_OF_MEMORY.
_MEMORY_KILL_MARKERS = ("Exceeded job memory limit", "exceeded memory limit", "oom_kill event")


def outcome_error(state: JobState | None, outcome: JobOutcome) -> SlurmJobError | None:
    """None when the job succeeded, else the error describing how it failed.

    A step killed by slurmstepd for exceeding its memory (its message in the job's stderr)
    is :class:`SlurmJobOutOfMemory` whatever the state. A state that names a cause (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, CANCELLED, ...) wins over
    the exit code, because the exit code of a killed payload (143, 137) says less: a job
    Slurm cancelled, timed out or preempted is an error even when its status file says 0 (a
    TERM before the payload starts is recorded as a drain, exit 0). A payload exit code of 0
    with state COMPLETED is success; any other exit code is :class:`SlurmJobNonZeroExit`.
    An unknown state (None) is never success: :class:`SlurmJobLost` saying so, or
    :class:`SlurmJobNonZeroExit` when the payload reported a non-zero code.
    """
    if state is None or state is JobState.UNKNOWN:
        if outcome.exit_code not in (0, None):
            return SlurmJobNonZeroExit(outcome, "the job's final state is unknown")
        if outcome.exit_code == 0:
            return SlurmJobLost(outcome, _UNKNOWN_WITH_ZERO)
        return SlurmJobLost(outcome, "neither the scheduler nor accounting knows how it ended")
    if REQUEUE_REFUSAL in outcome.stderr_tail:
        return SlurmJobRequeued(outcome, _REQUEUED_ADVICE)
    if state in (JobState.FAILED, JobState.CANCELLED) and any(
        marker in outcome.stderr_tail for marker in _MEMORY_KILL_MARKERS
    ):
        return SlurmJobOutOfMemory(outcome, _advice(JobState.OUT_OF_MEMORY))
    error_type = _BY_STATE.get(state)
    if error_type is not None:
        return error_type(outcome, _advice(state))
    if outcome.exit_code not in (0, None):
        return SlurmJobNonZeroExit(outcome)
    if state is JobState.COMPLETED:
        return None
    if outcome.exit_code == 0 and state is JobState.FAILED:
        return SlurmJobNonZeroExit(outcome, "the payload exited 0 but the job script failed")
    return SlurmJobNonZeroExit(outcome, f"job ended in state {state.value}")


_REQUEUED_ADVICE = (
    "its first start was lost (a node failure, a preemption, 'scontrol requeue', or a "
    "controller restarted without its state); re-execute the step, or set requeue=True in the queue "
    "configuration if the payload is safe to start again"
)

_UNKNOWN_WITH_ZERO = (
    "the job's final state is unknown (neither squeue nor accounting reports it), so its "
    "status file's exit code 0 is not taken as success: a job Slurm cancelled, timed out or "
    "preempted can leave one; check `sacct -j <id> -o State,ExitCode`"
)


def _advice(state: JobState) -> str:
    return {
        JobState.TIMEOUT: "raise time_limit, or checkpoint and continue in a later job",
        JobState.OUT_OF_MEMORY: "raise mem (or mem_per_cpu), or reduce the payload's memory use",
        JobState.NODE_FAIL: "a node went down under the job; retry, and report it to the site if it recurs",
        JobState.BOOT_FAIL: "a node failed to boot for the job; retry",
        JobState.CANCELLED: "cancelled by a user, an administrator or a dependency (scancel); "
        "check `sacct -j <id> -o State,Reason`",
        JobState.PREEMPTED: "a higher-priority job preempted it; retry or use a non-preemptible qos",
        JobState.DEADLINE: "the job's --deadline passed",
        JobState.REVOKED: "the job was revoked (federation)",
    }.get(state, "")
