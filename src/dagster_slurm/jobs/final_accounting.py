"""Reading a job's accounting until it shows how the job ended, within a deadline.

slurmctld sends job records to slurmdbd asynchronously. Right after a job ended, ``sacct``
can still show the state slurmdbd last heard of (PENDING, RUNNING), show no record, or
fail (slurmdbd unreachable: slurmctld then queues the records and sends them once it is
back). One answer is therefore not trusted: :func:`read_until_final` reads again, paced by
a :class:`~dagster_slurm.backoff.PollBackoff`, until the answer is final or the deadline has
passed; the caller then falls back on what it observed itself. The loop is pure (clock and
sleep are injected), so its schedule is unit-tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from dagster_slurm.agent.results import ExecResult
from dagster_slurm.backoff import PollBackoff
from dagster_slurm.jobs.metrics import SOURCE_SACCT, JobMetrics, from_sacct
from dagster_slurm.scheduler.accounting_outlook import (
    AccountingOutlook,
    AccountingReach,
    end_read_deadline,
    reach_of,
)
from dagster_slurm.scheduler.client import JobObservation, SlurmScheduler
from dagster_slurm.slurm.accounting import SacctRecord

T = TypeVar("T")

#: Seconds, from the first answer, during which accounting is read again while it does not
#: show a final state yet. This covers a slurmdbd that is merely behind; after slurmdbd was
#: away, slurmctld can take longer to send the records it queued (18-19 s measured on the
#: development cluster), and the observed state is reported instead, marked as such.
ACCOUNTING_DEADLINE = 15.0


def accounting_backoff() -> PollBackoff:
    """Intervals between two reads: 0.5 s first, growing by half up to 3 s."""
    return PollBackoff(initial=0.5, maximum=3.0, factor=1.5)


@dataclass(frozen=True)
class FinalRead(Generic[T]):
    """What :func:`read_until_final` got.

    ``value`` is the last answer (final or not); None when no read gave one. ``final``
    says whether ``value`` satisfied the caller's test. ``attempts`` counts the reads
    (the caller's first answer included), ``waited`` the seconds from the first answer to
    the last (0 when the first one was final). ``error`` is the exception that ended the
    reads early (a broken connection), None otherwise.
    """

    value: T | None
    final: bool
    attempts: int
    waited: float
    error: BaseException | None = None


def read_until_final(
    read: Callable[[], T],
    is_final: Callable[[T], bool],
    *,
    first: T | None = None,
    deadline: float = ACCOUNTING_DEADLINE,
    backoff: PollBackoff | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> FinalRead[T]:
    """Call ``read`` until ``is_final`` accepts its answer or ``deadline`` seconds passed.

    ``first`` is an answer the caller already has (e.g. read in the same round trip as
    other work); without it the first ``read`` happens at once. Each later read waits the
    backoff's next interval, cut so that no wait ends after the deadline; a last read
    happens at the deadline. An exception from ``read`` ends the reads (it is returned in
    :attr:`FinalRead.error`, never raised), since a broken link will not answer better by
    waiting. ``deadline`` 0 means a single answer.
    """
    pace = backoff or accounting_backoff()
    attempts = 0
    value = first
    if value is None:
        try:
            value = read()
        except Exception as exc:  # noqa: BLE001 - returned to the caller, who falls back
            return FinalRead(None, False, 0, 0.0, exc)
    attempts += 1
    start = clock()
    wait = pace.current
    while not is_final(value):
        remaining = deadline - (clock() - start)
        if remaining <= 0:
            break
        sleep(min(wait, remaining))
        try:
            value = read()
        except Exception as exc:  # noqa: BLE001 - returned to the caller, who falls back
            return FinalRead(value, False, attempts, clock() - start, exc)
        attempts += 1
        wait = pace.observe(False)
    return FinalRead(value, is_final(value), attempts, clock() - start)


@dataclass(frozen=True)
class AccountingAnswer:
    """One ``sacct`` answer about one job: its record (None when sacct failed or knew
    nothing of the job) and, when sacct failed, its message (else None)."""

    record: SacctRecord | None
    error: str | None = None

    @property
    def final(self) -> bool:
        """True when the record shows a final state."""
        return self.record is not None and self.record.state.terminal

    def describe(self) -> str:
        """The answer in words, for a log line."""
        if self.error is not None:
            return f"sacct failed: {self.error}"
        if self.record is None:
            return "sacct had no record of the job"
        return f"sacct said {self.record.raw_state or self.record.state.value}"


def sacct_answer(scheduler: SlurmScheduler, job_id: str, result: ExecResult) -> AccountingAnswer:
    """The answer about ``job_id`` in the result of ``scheduler.accounting_op``; a failed
    sacct gives no record and the last line of its message."""
    record = scheduler.accounting_records(result).get(job_id)
    if result.ok:
        return AccountingAnswer(record)
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    return AccountingAnswer(None, lines[-1] if lines else f"exit status {result.rc}")


def job_accounting(
    scheduler: SlurmScheduler,
    job_id: str,
    first: ExecResult,
    *,
    deadline: float = ACCOUNTING_DEADLINE,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> FinalRead[AccountingAnswer]:
    """Accounting of the finished job ``job_id``: ``first`` is the result of an
    ``accounting_op`` the caller already sent (in the round trip of other work); while it
    shows no final state, sacct is asked again, one round trip per read, until
    ``deadline`` seconds have passed (see :func:`read_until_final`).

    With ``started`` (the scheduler's clock when the job was submitted), a failing sacct is
    asked again only if it answered after that moment (slurmdbd restarting); accounting
    that is disabled, or away since before the job, is not waited for (see
    :func:`~dagster_slurm.scheduler.accounting_outlook.end_read_deadline`)."""

    def read() -> AccountingAnswer:
        return sacct_answer(scheduler, job_id, scheduler.agent.run(scheduler.accounting_op([job_id])))

    answer = sacct_answer(scheduler, job_id, first)
    if started is not None:
        deadline = end_read_deadline(scheduler.accounting_outlook.view(),
                                     reach_of(first.rc, first.stderr), started, deadline)
    return read_until_final(
        read, lambda answer: answer.final, first=answer,
        deadline=deadline, clock=clock, sleep=sleep,
    )


def observed_metrics(observation: JobObservation, read: FinalRead[AccountingAnswer] | None, *,
                     requested_mem_bytes: int | None = None,
                     observed_wait: float | None = None) -> JobMetrics:
    """The metrics of a job that ended, from its accounting ``read`` (None: not read) and
    the watcher's last ``observation``: a final accounting record when there is one (read
    afterwards, or the one the observation itself came from), else the observed state and
    node list with the observation's source and no other figure. ``requested_mem_bytes``
    and ``observed_wait`` are passed to :func:`~dagster_slurm.jobs.metrics.from_sacct`."""
    record = read.value.record if read is not None and read.value is not None else None
    if (record is None or not record.state.terminal) and observation.accounting is not None:
        record = observation.accounting
    nodes = observation.queue.node_list if observation.queue is not None else None
    state = observation.state.value if observation.state is not None else None
    return from_sacct(observation.job_id, record, observation.exit_code, state,
                      source=observation.source, nodes=nodes,
                      requested_mem_bytes=requested_mem_bytes, observed_wait=observed_wait)


def lag_warning(job_id: str, read: FinalRead[AccountingAnswer], metrics: JobMetrics) -> str | None:
    """The warning to log when accounting gave no final state (None when it did)."""
    if metrics.state_source == SOURCE_SACCT:
        return None
    last = read.value.describe() if read.value is not None else "no answer"
    if read.error is not None:
        last += f"; reading stopped on {type(read.error).__name__}: {read.error}"
    used = (f"state {metrics.state} as seen by {metrics.state_source}" if metrics.state
            else "no state (none was observed)")
    return (
        f"Accounting of Slurm job {job_id} showed no final state after {read.attempts} "
        f"read(s) over {read.waited:.1f} s ({last}); the metadata reports {used}, and "
        "elapsed time, node-hours, CPU efficiency, MaxRSS and the GPU figures as null"
    )


def accounting_away(answer: AccountingAnswer | None) -> AccountingReach | None:
    """How the last read failed when sacct failed (disabled, or unreachable), else None."""
    if answer is None or answer.error is None:
        return None
    return reach_of(1, answer.error)


def once_per_run(warning: str | None, answer: AccountingAnswer | None,
                 outlook: AccountingOutlook, run_id: str) -> str | None:
    """``warning`` (a :func:`lag_warning`) as the run should see it. When sacct *failed*
    (accounting disabled or slurmdbd away), the run is told once, with what follows for its
    other steps, and None is returned for the later ones; a stale answer (accounting merely
    behind) is said for every job, as it is about that job."""
    away = accounting_away(answer)
    if warning is None or away is None:
        return warning
    if not outlook.first_warning(run_id):
        return None
    why = ("Slurm accounting is disabled on this cluster" if away is AccountingReach.DISABLED
           else "Slurm's accounting (slurmdbd) does not answer")
    return (f"{warning}. {why}: the run's other steps report their states the same way, "
            "without waiting for accounting, and this is said once per run")
