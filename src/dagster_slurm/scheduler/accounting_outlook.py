"""What this process knows of the cluster's accounting (``sacct``), and what follows from it.

Some sites run without accounting (``sacct`` answers ``Slurm accounting storage is
disabled``), and on others slurmdbd can be away, for a few seconds or for hours (``sacct``
answers ``Problem talking to the database: Connection refused``). A job that ended is then
reported with the state ``squeue`` or its exit-status file gave, and null figures. Whether
reading ``sacct`` again is worth a wait depends on what happened before:

- accounting is **disabled**: it will never answer; nothing waits, and ``sacct`` is not
  asked again by this process;
- slurmdbd answered while the job lived and is away now: it is probably restarting, and
  slurmctld sends the records it queued once it is back; the job's end is read again until
  the accounting deadline (see :mod:`dagster_slurm.jobs.final_accounting`);
- slurmdbd has not answered since the job started (away for the whole job): nothing waits.

To know which, :class:`AccountingOutlook` remembers when ``sacct`` last answered and last
failed. The scheduler's status polls carry a cheap ``sacct`` probe (no job, an empty time
window) when the outlook has heard nothing for :data:`PROBE_INTERVAL` seconds, in the same
round trip. The outlook also keeps which runs were already told that accounting is away, so
a run gets that warning once, not once per step or poll.

Pure apart from a lock: times are passed in by the caller.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

#: Seconds after which the outlook is asked again by a status poll's probe.
PROBE_INTERVAL = 60.0

#: What ``sacct`` prints when the cluster has no accounting storage.
_DISABLED_TEXT = "accounting storage is disabled"


class AccountingReach(enum.Enum):
    """How one ``sacct`` call went."""

    #: It answered (exit status 0), whatever it said about the jobs.
    ANSWERED = "answered"
    #: The cluster has no accounting storage (``AccountingStorageType=accounting_storage/none``).
    DISABLED = "disabled"
    #: It failed: slurmdbd unreachable, or another error.
    UNREACHABLE = "unreachable"


def reach_of(rc: int, stderr: str) -> AccountingReach:
    """How a ``sacct`` call with exit status ``rc`` and error text ``stderr`` went."""
    if rc == 0:
        return AccountingReach.ANSWERED
    if _DISABLED_TEXT in stderr.lower():
        return AccountingReach.DISABLED
    return AccountingReach.UNREACHABLE


def probe_argv() -> list[str]:
    """A ``sacct`` call that asks slurmdbd for nothing (an empty time window), to learn
    whether it answers."""
    return ["sacct", "--noheader", "--allocations", "--starttime=now", "--endtime=now",
            "--format=JobID"]


@dataclass(frozen=True)
class OutlookView:
    """A copy of the outlook at one moment: when ``sacct`` last answered and last failed
    (monotonic seconds, None: never seen), and whether accounting is disabled."""

    answered_at: float | None
    failed_at: float | None
    disabled: bool

    def answered_since(self, moment: float) -> bool:
        """True when ``sacct`` answered at ``moment`` or later."""
        return self.answered_at is not None and self.answered_at >= moment


def end_read_deadline(view: OutlookView, first: AccountingReach, job_started: float,
                      deadline: float) -> float:
    """Seconds to go on reading accounting of a job that ended, given the first read's
    ``first`` reach: ``deadline`` when the answer may still improve (``sacct`` answered,
    or it fails now but answered after ``job_started``, so slurmdbd is only restarting),
    else 0 (accounting disabled, or away since before the job started)."""
    if first is AccountingReach.ANSWERED:
        return deadline
    if first is AccountingReach.DISABLED or view.disabled:
        return 0.0
    return deadline if view.answered_since(job_started) else 0.0


class AccountingOutlook:
    """This process's memory of one cluster's accounting (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answered_at: float | None = None
        self._failed_at: float | None = None
        self._disabled = False
        self._warned_runs: set[str] = set()

    def observe(self, reach: AccountingReach, at: float) -> None:
        """Record one ``sacct`` call's ``reach`` at monotonic time ``at``."""
        with self._lock:
            if reach is AccountingReach.ANSWERED:
                self._answered_at = max(at, self._answered_at or at)
                self._disabled = False
            else:
                self._failed_at = max(at, self._failed_at or at)
                self._disabled = reach is AccountingReach.DISABLED

    def view(self) -> OutlookView:
        """The outlook as of now."""
        with self._lock:
            return OutlookView(self._answered_at, self._failed_at, self._disabled)

    def probe_due(self, now: float) -> bool:
        """True when a status poll at ``now`` should carry a probe: nothing heard for
        :data:`PROBE_INTERVAL` seconds, and accounting not known to be disabled."""
        with self._lock:
            if self._disabled:
                return False
            last = max(self._answered_at or float("-inf"), self._failed_at or float("-inf"))
            return now - last >= PROBE_INTERVAL

    def first_warning(self, run_id: str) -> bool:
        """True the first time it is asked for ``run_id`` (the run is told once that
        accounting is away), False afterwards."""
        with self._lock:
            if run_id in self._warned_runs:
                return False
            self._warned_runs.add(run_id)
            return True
