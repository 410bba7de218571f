"""Two scaling policies over the session's hooks (inspect, estimate_worker_starts,
reconcile_workers). Everything here is application policy: the library observes, probes and
acts; these functions only decide.

* :func:`batch_intent`: independent tasks with checkpoints and a cheap start. Any allocation
  that starts soon helps while enough tasks remain, however short its walltime (an
  unfinished task runs again elsewhere): grow by one allocation per step, shrink as soon as
  the tasks run out, and cancel a start that does not happen.
* :func:`model_intent`: work behind an expensive model load. An allocation must live long
  enough to repay its start, so a short window is declined even when GPUs are free, and a
  worker should not outlive the head it joins.

:func:`reconcile_step` is one step of either loop: observe, probe, decide, act.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dagster_slurm import (
    AllocationSnapshot,
    ReconcileResult,
    RunSession,
    SessionSnapshot,
    SlurmWorkerAllocationConfig,
    WorkerIntent,
    WorkerStartEstimate,
)

#: How soon a candidate must start to be worth waiting for, per workload (seconds).
BATCH_START_WITHIN = 120.0
MODEL_START_WITHIN = 300.0
#: A model worker's walltime must cover this many model starts.
MODEL_AMORTIZATION = 4
#: Seconds a model worker must end before the head it joins.
HEAD_MARGIN = 600.0


def active(snapshot: SessionSnapshot, key: str) -> list[AllocationSnapshot]:
    """The intent's allocations that count: pending or running, not being released."""
    return [w for w in snapshot.workers(key) if w.committed and w.drain_deadline is None]


def batch_intent(remaining_tasks: int, snapshot: SessionSnapshot,
                 estimates: Sequence[WorkerStartEstimate], *, key: str = "batch",
                 tasks_per_allocation: int = 4, pending_timeout: float = 120.0) -> WorkerIntent:
    """Enough allocations for the remaining tasks, growing by at most one per step, and only
    with a candidate that starts soon."""
    live = len(active(snapshot, key))
    wanted = -(-max(0, remaining_tasks) // tasks_per_allocation)
    soon = [e for e in estimates if e.starts_within(BATCH_START_WITHIN)]
    grow = 1 if soon and live < wanted else 0
    return WorkerIntent(key=key, count=min(wanted, live + grow),
                        config=soon[0].config if soon else None,
                        pending_timeout=pending_timeout)


def model_intent(startup_seconds: float, work_left: bool, snapshot: SessionSnapshot,
                 estimates: Sequence[WorkerStartEstimate], *, key: str = "model",
                 drain_timeout: float = 900.0) -> WorkerIntent:
    """One more allocation when a candidate starts soon, lives at least
    :data:`MODEL_AMORTIZATION` model starts and ends :data:`HEAD_MARGIN` before the head;
    none once the work is done (in-flight requests get ``drain_timeout`` to finish)."""
    if not work_left:
        return WorkerIntent(key=key, count=0, drain_timeout=drain_timeout)
    head_left = snapshot.head.time_left_seconds if snapshot.head is not None else None

    def worth_it(estimate: WorkerStartEstimate) -> bool:
        limit = estimate.time_limit_seconds
        return (estimate.starts_within(MODEL_START_WITHIN) and limit is not None
                and limit >= MODEL_AMORTIZATION * startup_seconds
                and (head_left is None or limit <= head_left - HEAD_MARGIN))

    chosen = [e for e in estimates if worth_it(e)]
    return WorkerIntent(key=key, count=len(active(snapshot, key)) + (1 if chosen else 0),
                        config=chosen[0].config if chosen else None,
                        drain_timeout=drain_timeout)


@dataclass(frozen=True)
class Step:
    """What one reconciliation step saw and did."""

    intent: WorkerIntent
    estimates: tuple[WorkerStartEstimate, ...]
    result: ReconcileResult


def reconcile_step(session: RunSession,
                   decide: Callable[[SessionSnapshot, Sequence[WorkerStartEstimate]], WorkerIntent],
                   candidates: Sequence[SlurmWorkerAllocationConfig]) -> Step:
    """Observe the session, probe ``candidates``, let ``decide`` pick the intent, and let the
    session revalidate and act (never adding more than the decision added)."""
    snapshot = session.inspect()
    estimates = tuple(session.estimate_worker_starts(list(candidates)))
    intent = decide(snapshot, estimates)
    added = max(0, intent.count - len(active(snapshot, intent.key)))
    result = session.reconcile_workers(intent, observed=snapshot, max_submissions=added)
    return Step(intent, estimates, result)
