"""What a pending job is waiting for, in words, and which waits can never end.

Pure policy: :func:`explain_pending` turns the scheduler's reason code and start estimate
into a log line; :data:`DEFAULT_FATAL_REASONS` lists the reasons after which a job cannot
start as submitted, each with what to change. The runner fails such a job after a short
grace period (the scheduler sometimes shows a transient reason right after submission).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

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
