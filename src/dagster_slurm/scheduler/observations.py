"""What one poll of the scheduler observed, and what a client's calls cost.

:class:`StatusSnapshot` holds one poll's squeue, accounting and exit-status answers and
combines them into a :class:`JobObservation` per job; :class:`SchedulerStats` counts the
scheduler RPCs a :class:`~dagster_slurm.scheduler.client.SlurmScheduler` caused. Pure data.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from dagster_slurm.slurm import JobState, SacctRecord, SqueueRecord


@dataclass
class SchedulerStats:
    """How many scheduler RPCs (sbatch, squeue, sacct, scancel, scontrol) this client caused;
    an ``sbatch --test-only`` of a start estimate counts as ``sbatch_test``, the accounting
    probe of a status poll (at most one a minute) as ``sacct_probe``."""

    calls: int = 0
    by_command: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, command: str, n: int = 1) -> None:
        with self._lock:
            self.calls += n
            self.by_command[command] = self.by_command.get(command, 0) + n

    def reset(self) -> None:
        with self._lock:
            self.calls = 0
            self.by_command.clear()


@dataclass(frozen=True)
class SubmittedJob:
    """A job the scheduler accepted: its id and the token carried in its comment."""

    job_id: str
    token: str
    recovered: bool = False


@dataclass(frozen=True)
class JobObservation:
    """What is known about one job at one poll.

    ``state`` is None when nothing could be observed (the scheduler did not answer, or the
    job left the queue and accounting has no record); a status file never supplies a state,
    since a job Slurm cancelled, timed out or preempted can leave one saying 0. ``exit_code``
    comes from the job's status file when the library wrote one, else from accounting; None
    when unknown. ``source`` says where ``state`` came from: ``squeue`` or ``sacct``.
    """

    job_id: str
    state: JobState | None
    reason: str | None = None
    start_time: datetime | None = None
    exit_code: int | None = None
    source: str | None = None
    queue: SqueueRecord | None = None
    accounting: SacctRecord | None = None

    @property
    def terminal(self) -> bool:
        """True once the job has finished, by any source."""
        return self.state is not None and self.state.terminal


@dataclass(frozen=True)
class StatusSnapshot:
    """One poll of the scheduler for a set of job names.

    ``certain`` is False when squeue failed: then no job's absence means anything.
    ``observed_at`` is the login node's clock (epoch seconds) at the query.
    """

    observed_at: float | None
    certain: bool
    queue: Mapping[str, SqueueRecord]
    accounting: Mapping[str, SacctRecord]
    exit_codes: Mapping[str, int | None]
    absent: tuple[str, ...]
    error: str | None = None

    def ended_state(self, job_id: str) -> str | None:
        """The final state name of ``job_id`` when this poll shows it has ended: a terminal
        state, or ``UNKNOWN`` when a certain squeue no longer lists it and nothing else
        says how it ended. None while it is pending or running (or nothing is certain)."""
        observed = self.job(job_id)
        if observed.state is not None:
            return observed.state.value if observed.state.terminal else None
        return "UNKNOWN" if self.certain and job_id in self.absent else None

    def job(self, job_id: str) -> JobObservation:
        """Combine squeue, the status file and accounting into one observation."""
        rec = self.queue.get(job_id)
        acct = self.accounting.get(job_id)
        code = self.exit_codes.get(job_id)
        if code is None and acct is not None:
            code = acct.exit_code
        if rec is not None and rec.state is not JobState.UNKNOWN:
            return JobObservation(
                job_id, rec.state, rec.reason, rec.start_time, code, "squeue", rec, acct
            )
        if acct is not None and acct.state is not JobState.UNKNOWN:
            return JobObservation(job_id, acct.state, None, acct.start_time, code, "sacct", None, acct)
        # Left the queue, accounting silent: the state is unknown, whatever a status file says.
        return JobObservation(job_id, None, exit_code=code)



def parse_exit_code(data: str | bytes | None) -> int | None:
    """The exit status in a status file's text (its first word), None when unreadable."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    if data is None:
        return None
    text = data.strip().split()[0] if data.strip() else ""
    return int(text) if text.lstrip("-").isdigit() else None
