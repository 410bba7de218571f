"""Results and typed failures of steps run inside a run-scoped allocation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.errors import JobOutcome, SlurmJobError, SlurmNodeFailure

#: ``allocation_state`` of a step whose allocation was replaced before the step started.
REPLACED = "REPLACED"
#: ``allocation_state`` of a step that failed while its allocation's job runs but the Ray
#: head there stopped (its step server recorded that the GCS no longer answers): the head
#: is replaced by the next election.
RAY_STOPPED = "RAY_STOPPED"
#: ``allocation_state`` of a step whose allocation Slurm put back in the queue (requeued)
#: after it had started: the step's payload is gone with that start.
REQUEUED = "REQUEUED"
#: Allocation states that mean a node failed under the step or Slurm took the allocation
#: back to start it again: :class:`SlurmAllocationNodeFailure`.
NODE_LOSS_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", REQUEUED})


@dataclass(frozen=True)
class SlurmStepExecutionResult:
    """How one step inside an allocation ended.

    ``exit_code``: the payload's exit status (128+N when signal N ended it); None when the
    step never wrote one (its allocation ended first). ``drained``: the allocation's drain
    signal reached the step, or the step was not started because the allocation was
    draining. ``drain_signal``: that signal's name (``USR1``), None when not drained.
    ``allocation_state``: the allocation's scheduler state when it ended under the step
    (``TIMEOUT``, ``CANCELLED``, ... ``REPLACED`` or ``RAY_STOPPED``), None while it still
    runs.
    """

    job_id: str
    step_name: str
    exit_code: int | None
    drained: bool = False
    drain_signal: str | None = None
    allocation_state: str | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""

    nodes: tuple[str, ...] = ()
    """The allocation's hosts, head first (``()`` when not known)."""

    def outcome(self) -> JobOutcome:
        return JobOutcome(
            self.job_id, self.allocation_state or "RUNNING", self.exit_code,
            self.stdout_tail, self.stderr_tail, nodes=self.nodes,
        )


class SlurmAllocationEnded(SlurmJobError):
    """The run's allocation ended (walltime, cancellation, node failure, replacement) while a
    step ran in it or before it started. ``result`` holds what was observed, with
    ``result.allocation_state``."""

    headline = "the run allocation ended under the step"

    def __init__(self, result: SlurmStepExecutionResult, detail: str = "") -> None:
        self.result = result
        super().__init__(result.outcome(), detail)


class SlurmAllocationNodeFailure(SlurmAllocationEnded, SlurmNodeFailure):
    """A node of the run's allocation failed under the step (``NODE_FAIL``, ``BOOT_FAIL``) or
    Slurm requeued the allocation (``REQUEUED``). The step's payload is lost with that start
    of the allocation and is never started again by the library: run allocations are
    submitted with ``--no-requeue``, and a restarted one does not serve steps. Both an
    :class:`SlurmAllocationEnded` and a
    :class:`~dagster_slurm.jobs.errors.SlurmNodeFailure`."""

    headline = "a node of the run allocation failed under the step"


def allocation_ended(result: SlurmStepExecutionResult, detail: str) -> SlurmAllocationEnded:
    """The error for a step whose allocation ended (``result.allocation_state``): a
    :class:`SlurmAllocationNodeFailure` for a lost node or a requeue (with what became of
    the allocation and what to do), else :class:`SlurmAllocationEnded`."""
    if result.allocation_state not in NODE_LOSS_STATES:
        return SlurmAllocationEnded(result, detail)
    where = f" on {','.join(result.nodes)}" if result.nodes else ""
    fate = ("Slurm put it back in the queue; it is cancelled, since a restarted allocation "
            "would not have the step" if result.allocation_state == REQUEUED else
            "Slurm ended it (run allocations are submitted with --no-requeue)")
    return SlurmAllocationNodeFailure(result, (
        f"{detail}. The allocation{where} lost a node ({result.allocation_state}): {fate}. "
        "The payload is not started again; the run's next step gets a new allocation. "
        "Re-execute the step, and report the node to the site if it recurs"
    ))


class SlurmStepFailed(SlurmJobError):
    """A step inside the run allocation exited non-zero without being drained."""

    headline = "payload exited with a non-zero code"

    def __init__(self, result: SlurmStepExecutionResult, detail: str = "") -> None:
        self.result = result
        super().__init__(result.outcome(), detail)


class SlurmStepDrained(DagsterSlurmError):
    """A ``compute.run`` was drained: partial work must not be materialised silently.

    ``result`` is the :class:`SlurmStepExecutionResult`; ``invocation`` the
    ``PipesClientCompletedInvocation`` with every message the payload reported.
    """

    def __init__(self, result: SlurmStepExecutionResult, invocation: Any) -> None:
        self.result = result
        self.invocation = invocation
        super().__init__(
            f"step {result.step_name} in allocation {result.job_id} was drained "
            f"(signal {result.drain_signal}, exit code {result.exit_code}); decide from the "
            "payload's reports whether work remains"
        )


class SessionError(DagsterSlurmError):
    """The run session cannot provide an allocation (submission failed, startup failed), or
    refused a successor operation (one is outstanding, it is not RUNNING, a predecessor
    payload is active); the message says which and what to do."""


class PromotionDeferred(SessionError):
    """A promotion that may succeed when tried again shortly: the predecessor still has
    unfinished payload steps (a draining head's drivers stop at their checkpoint), or the
    scheduler did not answer."""
