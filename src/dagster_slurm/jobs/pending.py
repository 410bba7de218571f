"""What a pending job is waiting for, in words, and which waits can never end.

Policy: :func:`explain_pending` turns the scheduler's reason code and start estimate into a
log line; :data:`DEFAULT_FATAL_REASONS` lists the reasons after which a job cannot start as
submitted, each with what to change. :class:`PendingTracker` applies a
:class:`PendingPolicy` to each observation of one job (the asset-scope runner's job, the
run session's allocation): it logs the reason, fails such a job after a short grace period
(the scheduler sometimes shows a transient reason right after submission) and reports the
job's start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from dagster_slurm.jobs.errors import JobOutcome, SlurmJobUnschedulable

if TYPE_CHECKING:
    from dagster_slurm.scheduler.client import JobObservation

#: Reason code -> what the user should change. Used as the default of
#: ``ComputeResource.fatal_pending_reasons``.
DEFAULT_FATAL_REASONS: Mapping[str, str] = {
    "PartitionTimeLimit": "the walltime is above the partition's MaxTime: lower time_limit "
    "or choose a partition that allows it",
    "PartitionNodeLimit": "the node count is outside the partition's limits: change num_nodes "
    "or the partition",
    "PartitionDown": "the partition is down: choose another partition or wait for the site",
    "PartitionInactive": "the partition is inactive: choose another partition",
    "AssocMaxWallDurationPerJobLimit": "the walltime is above your association's per-job "
    "limit: lower time_limit",
    "QOSMaxWallDurationPerJobLimit": "the walltime is above the QoS per-job limit: lower "
    "time_limit or use another qos",
    "AssocMaxNodePerJobLimit": "the node count is above your association's per-job limit",
    "QOSMaxNodePerJobLimit": "the node count is above the QoS per-job limit",
    "QOSMaxGRESPerJob": "the GPU/GRES request is above the QoS per-job limit",
    "QOSMaxMemoryPerJob": "the memory request is above the QoS per-job limit (MaxTRESPerJob "
    "mem): lower mem or mem_per_cpu, or use another qos",
    "AssocMaxMemPerJob": "the memory request is above your association's per-job limit "
    "(MaxTRES mem): lower mem or mem_per_cpu",
    "AssocMaxCpuPerJobLimit": "the CPU request is above your association's per-job limit",
    "QOSMaxCpuPerJobLimit": "the CPU request is above the QoS per-job limit",
    "InvalidAccount": "the account is not valid for you: fix account",
    "InvalidQOS": "the QoS is not valid for you or this partition: fix qos",
    "BadConstraints": "the constraints cannot be satisfied by any node",
    "ReqNodeNotAvail": "the requested nodes are not available (down, drained or reserved); "
    "choose other nodes or a partition with available ones",
    "Reservation": "the reservation is not usable: check reservation",
    "JobHeldAdmin": "an administrator holds the job",
}


@dataclass(frozen=True)
class PendingReport:
    """A log line about a pending job and whether the wait can ever end."""

    message: str
    fatal: bool
    advice: str | None


def explain_pending(
    job_id: str,
    reason: str | None,
    start_estimate: datetime | None,
    *,
    fatal_reasons: Mapping[str, str] = DEFAULT_FATAL_REASONS,
    now: datetime | None = None,
) -> PendingReport:
    """Describe why ``job_id`` is pending; ``fatal`` when ``reason`` is in ``fatal_reasons``.

    ``ReqNodeNotAvail`` is fatal only when no node can return: Slurm appends
    ``UnavailableNodes:...`` either way, so it is judged by the code alone; sites where
    nodes come back routinely can drop it from the list.
    """
    code = (reason or "").split(",")[0].split("(")[0].strip() or None
    if code in ("None", ""):
        code = None
    words = f"waiting in the queue: reason {code}" if code else "waiting in the queue"
    if start_estimate is not None:
        when = start_estimate.isoformat(sep=" ", timespec="seconds")
        if now is not None:
            delta = (start_estimate - now).total_seconds()
            when += f" (in {_duration(delta)})" if delta > 0 else " (overdue)"
        words += f"; scheduler estimates start at {when}"
    else:
        words += "; no start estimate yet"
    advice = fatal_reasons.get(code) if code else None
    return PendingReport(f"Slurm job {job_id} is {words}", advice is not None, advice)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class PendingPolicy:
    """How to report and judge a job waiting in the queue.

    ``log_interval``: seconds between repeated "waiting" log lines (a changed reason is
    logged at once). ``fatal_reasons``: reason -> advice; a job pending for one of them
    longer than ``grace`` seconds is cancelled and fails with that advice.
    """

    fatal_reasons: Mapping[str, str]
    log_interval: float = 30.0
    grace: float = 10.0


class PendingTracker:
    """Judges the observations of one job under a :class:`PendingPolicy` (call it with each).

    While the job is pending, ``emit`` gets the :func:`explain_pending` line when the reason
    changes and every ``log_interval`` seconds; a fatal reason seen for ``grace`` seconds
    raises :class:`~dagster_slurm.jobs.errors.SlurmJobUnschedulable` (the caller cancels the
    job). The first observation of the job running emits one line naming its nodes, then
    calls ``on_running``. A job seen running and then pending again was requeued: ``warn``
    (default ``emit``) gets one line naming the nodes it ran on, the scheduler's reason and
    ``requeue_note`` (what becomes of the payload), and the next start is reported again.
    """

    def __init__(
        self, job_id: str, policy: PendingPolicy, emit: Callable[[str], None],
        on_running: Callable[[], None] = lambda: None,
        *,
        warn: Callable[[str], None] | None = None,
        requeue_note: str = "",
    ) -> None:
        self.warn = warn or emit
        self.requeue_note = requeue_note
        self.restarts = 0
        self._ran_on = ""
        self.on_running = on_running
        self.job_id = job_id
        self.policy = policy
        self.emit = emit
        self._last_reason: str | None = None
        self._last_log = float("-inf")
        self._fatal_since: float | None = None
        self._running_logged = False

    def __call__(self, obs: JobObservation) -> None:
        now = time.monotonic()
        if obs.state is not None and obs.state.pending and self._running_logged:
            self._requeued(obs)
        if obs.state is not None and obs.state.pending:
            report = explain_pending(
                self.job_id, obs.reason, obs.start_time,
                fatal_reasons=self.policy.fatal_reasons, now=datetime.now(),
            )
            if obs.reason != self._last_reason or now - self._last_log >= self.policy.log_interval:
                self.emit(report.message)
                self._last_reason, self._last_log = obs.reason, now
            if report.fatal:
                self._fatal_since = self._fatal_since or now
                if now - self._fatal_since >= self.policy.grace:
                    raise SlurmJobUnschedulable(
                        JobOutcome(self.job_id, obs.state.value, None, reason=obs.reason),
                        f"pending with reason {obs.reason}: {report.advice}",
                    )
            else:
                self._fatal_since = None
        elif obs.state is not None and obs.state.active and not self._running_logged:
            nodes = ",".join(obs.queue.nodes or ()) if obs.queue else ""
            self.emit(f"Slurm job {self.job_id} is {obs.state.value}" + (f" on {nodes}" if nodes else "")
                      + (f" again (start {self.restarts + 1})" if self.restarts else ""))
            self._running_logged = True
            self._ran_on = nodes
            self.on_running()

    def _requeued(self, obs: JobObservation) -> None:
        """The job ran and is pending again: Slurm requeued it. Said once per requeue."""
        self.restarts += 1
        self._running_logged = False
        where = f" on {self._ran_on}" if self._ran_on else ""
        reason = f" (reason {obs.reason})" if obs.reason else ""
        self.warn(f"Slurm requeued job {self.job_id}: it ran{where} and is back in the queue "
                  f"as {obs.state.value if obs.state else 'pending'}{reason}"
                  + (f"; {self.requeue_note}" if self.requeue_note else ""))


def nodes_of(obs: JobObservation) -> tuple[str, ...]:
    """The hosts of an observed job, from squeue or else accounting (``()`` when unknown)."""
    for record in (obs.queue, obs.accounting):
        nodes = getattr(record, "nodes", None) if record is not None else None
        if nodes:
            return tuple(nodes)
    return ()
