"""Removing and listing a run session's worker allocations, and releasing them at teardown.

:func:`remove_worker_allocation` takes one worker allocation out of the run's Ray cluster:

* **Not started** (PENDING, or CONFIGURING: its batch script has not run): the job is
  cancelled (``scancel <job id>``); it ends CANCELLED.
* **Running**: the drain deadline is persisted first, with the
  :func:`~dagster_slurm.state.worker_transitions.request_worker_drain` transition (now +
  ``drain_timeout`` by the login node's clock, under the session lock). Then one round trip
  writes ``jobs/<job id>/drain`` (``deadline=<epoch s>``) and signals the batch script
  (``scancel --batch --signal=USR1 <job id>``), which drains the nodes through Ray: Ray
  places nothing new there, running tasks and actors go on, each node leaves once idle and
  the job ends (COMPLETED) when all have left; nodes still busy at the deadline are stopped
  by the batch script. A repeated call keeps the persisted deadline (the drain file and the
  signal are sent again, with the same deadline) and follows the drain like the first.
* **Ended** already: nothing is sent.

Following the job: with ``wait=True`` the call polls squeue (one round trip per poll,
paced from 1 to 5 seconds) until the job has left the queue, logging the nodes still in
the Ray cluster and the time to the deadline. A job still running :data:`DRAIN_GRACE`
seconds after its deadline is cancelled, with a log line saying so. The final state comes
from accounting (sacct, read again for up to
:data:`~dagster_slurm.jobs.final_accounting.ACCOUNTING_DEADLINE` seconds while it lags),
else from squeue; then the release is recorded
(:func:`~dagster_slurm.state.worker_transitions.release_worker`, with that state). While the
scheduler does not answer, nothing is cancelled and nothing is released: the wait goes on,
logged, and raises :class:`~dagster_slurm.errors.SchedulerError` after
:data:`UNANSWERED_LIMIT` seconds without an answer (the drain request stands: the batch
script keeps its deadline; calling again follows it). With ``wait=False`` the same
follow-up runs in a daemon thread named ``dagster-slurm-worker-removal-<job id>`` and the
call returns None once the cancel or the drain request has been sent: the thread ends with
the process (the drain itself goes on in the cluster; the release is then recorded by the
next call for the allocation, or at teardown).

Removing a worker allocation never signals the head allocation or the payload drivers. A
worker allocation that hosts the head (after an election) hands the head over first: once
its drain deadline is persisted the session counts the head as draining, the batch script
passes the drain on to the head's step server (its payload steps get the drain signal, new
steps are answered "drained"), and the removal elects the next head
(``replace_head()``: a running successor, another worker allocation, else a new allocation
shaped like the first head) before it follows the drain; with ``wait=False`` the election
runs in the background thread too. The old head's control plane stays up until the
allocation's drain ends, for the work still draining there.

:func:`worker_allocations` lists the live (not released) worker allocations the session
document records, so that a restarted supervisor finds them and can remove them.
:func:`release_at_close` records every live worker allocation as released when the session
is closed (teardown cancelled them by the session's job name).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dagster_slurm.errors import ConfigurationError, DagsterSlurmError, SchedulerError
from dagster_slurm.jobs.final_accounting import ACCOUNTING_DEADLINE, read_until_final
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.protocol import DRAIN_GRACE_SECONDS, REMOVAL_SIGNAL
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.workers.submit import WorkerAllocation
from dagster_slurm.slurm.accounting import SacctRecord
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt
from dagster_slurm.state.schema import SessionDocument, Worker

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext

log = logging.getLogger("dagster_slurm.session")

#: The signal the batch script of a worker allocation drains on (``scancel --batch``).
DRAIN_SIGNAL = REMOVAL_SIGNAL
#: Seconds after the drain deadline before a worker allocation that still runs is cancelled
#: (the batch script stops its nodes at the deadline and exits by itself before that).
DRAIN_GRACE = DRAIN_GRACE_SECONDS
#: Seconds without an answer from the scheduler after which following a removal raises.
UNANSWERED_LIMIT = 600.0
#: Seconds between two progress lines while nothing changes.
PROGRESS_INTERVAL = 30.0
#: Seconds between two reads of the allocation's joined nodes while it drains.
NODES_INTERVAL = 10.0
_THREAD_PREFIX = "dagster-slurm-worker-removal-"


# -- listing ------------------------------------------------------------------------------------
def worker_allocations(session: SessionContext) -> list[WorkerAllocation]:
    """The live (not released) worker allocations the session document records, oldest job
    first, as :class:`~dagster_slurm.session.workers.submit.WorkerAllocation` handles.
    One read of the document; an allocation whose job ended without its release being
    recorded is listed until a removal (or the teardown) records it."""
    doc = session.io.read().doc
    records = wt.live_workers(doc)
    return [_handle(session, records[job_id])
            for job_id in sorted(records, key=lambda j: (len(j), j))]


def _handle(session: SessionContext, record: Worker) -> WorkerAllocation:
    known = {k: v for k, v in record.config.items()
             if k in SlurmWorkerAllocationConfig.model_fields}
    try:
        config = SlurmWorkerAllocationConfig(**known)
    except (ValueError, ConfigurationError) as exc:  # written by another library version
        log.warning("worker allocation %s: its recorded configuration does not validate "
                    "(%s); listed with it as recorded", record.job_id, exc)
        config = SlurmWorkerAllocationConfig.model_construct(**known)
    return WorkerAllocation(session, record.job_id, record.token or "", config)


# -- removal ------------------------------------------------------------------------------------
def remove_worker_allocation(session: SessionContext, allocation: WorkerAllocation | str,
                             drain_timeout: float = 600.0, wait: bool = True,
                             logger: Any = None) -> JobState | None:
    """Remove the worker allocation ``allocation`` (a handle with ``job_id``, or the job id)
    from the session; see the module docstring. Returns its final Slurm state (normally
    COMPLETED after a drain, CANCELLED for one that had not started; UNKNOWN when neither
    squeue nor sacct says how it ended), or None with ``wait=False``. Raises
    :class:`SessionError` when the session has no such worker allocation, and
    :class:`SchedulerError` when the scheduler does not answer for :data:`UNANSWERED_LIMIT`
    seconds (nothing is then cancelled or released)."""
    if isinstance(drain_timeout, bool) or not (
            isinstance(drain_timeout, int | float) and math.isfinite(drain_timeout)
            and drain_timeout >= 0):
        raise ConfigurationError("drain_timeout", drain_timeout,
                                 "must be a finite number of seconds, 0 or more")
    job_id = str(getattr(allocation, "job_id", allocation))
    out = _SafeLog(logger)
    doc, record = _record(session, job_id)
    if record.released:
        out.info(f"Worker allocation {job_id} was released from the session already"
                 + (f" ({record.final_state})" if record.final_state else ""))
        if not wait:
            return None
        return JobState.parse(record.final_state) if record.final_state else JobState.UNKNOWN
    head = doc.allocation  # a worker allocation that hosts the head hands it over first
    hosts = head is not None and head.job_id is not None and str(head.job_id) == job_id
    removal = _Removal(session, job_id, out, hand_over=hosts)
    snapshot = removal.observe()
    observed = snapshot.job(job_id)
    deadline: float | None = None
    if snapshot.ended_state(job_id) is None:
        if observed.state is not None and (observed.state.pending
                                           or observed.state is JobState.CONFIGURING):
            reason = f", reason {observed.reason}" if observed.reason else ""
            session.io.cancel([job_id])
            out.info(f"Worker allocation {job_id} had not started ({observed.state.value}"
                     f"{reason}): cancelled it")
        else:
            deadline = removal.request_drain(drain_timeout, snapshot)
    if not wait:
        thread = threading.Thread(target=removal.follow_quietly, args=(deadline, snapshot),
                                  name=f"{_THREAD_PREFIX}{job_id}", daemon=True)
        thread.start()
        return None
    return removal.follow(deadline, snapshot, session.pause)


def _record(session: SessionContext, job_id: str) -> tuple[SessionDocument, Worker]:
    """The session document (one read) and worker allocation ``job_id``'s record in it."""
    doc = session.io.read().doc
    record = doc.workers.get(job_id) if doc is not None else None
    if record is None:
        raise SessionError(
            f"the run session {session.job_name} has no worker allocation with job id "
            f"{job_id!r}; session.worker_allocations lists the live ones")
    assert doc is not None
    return doc, record


class _Removal:
    """One worker allocation being removed: the drain request and the follow-up."""

    def __init__(self, session: SessionContext, job_id: str, out: _SafeLog, *,
                 hand_over: bool = False) -> None:
        self.session = session
        self.job_id = job_id
        self.out = out
        #: the allocation hosts the head: elect another before following the drain
        self.hand_over = hand_over

    # -- the scheduler, waiting out an unanswered one ---------------------------------------
    def observe(self, pause: Callable[[float, str], None] | None = None) -> StatusSnapshot:
        """A certain squeue of the session's jobs; while the scheduler does not answer, waits
        (logged) and asks again, raising after :data:`UNANSWERED_LIMIT` seconds."""
        session = self.session
        pause = pause or session.pause
        since: float | None = None
        told = -math.inf
        backoff = PollBackoff(initial=1.0, maximum=15.0, factor=1.5)
        while True:
            try:
                snapshot = session.io.queue([session.job_name], [self.job_id])
                error = None if snapshot.certain else (snapshot.error or "no answer")
            except DagsterSlurmError as exc:
                error = f"{type(exc).__name__}: {exc}"
            if error is None:
                return snapshot
            now = session.clock()
            since = now if since is None else since
            if now - since >= UNANSWERED_LIMIT:
                raise SchedulerError(
                    f"the scheduler did not answer for {now - since:.0f} s ({error}) while "
                    f"removing worker allocation {self.job_id}; nothing was cancelled or "
                    "released. A drain already requested stands (its batch script keeps the "
                    "deadline): call remove_worker_allocation() again to follow it")
            if now - told >= PROGRESS_INTERVAL:
                told = now
                self.out.warning(
                    f"The scheduler does not answer ({error}); waiting to learn the state of "
                    f"worker allocation {self.job_id} (nothing is cancelled or released while "
                    "it is unknown)")
            pause(backoff.observe(False), f"worker allocation {self.job_id}")

    # -- the drain request ----------------------------------------------------------------
    def request_drain(self, drain_timeout: float, snapshot: StatusSnapshot) -> float:
        """Persist the drain deadline (or keep the one persisted), then write the drain file
        and signal the batch script in one round trip; the deadline (epoch seconds)."""
        session, job_id = self.session, self.job_id
        deadline = self._persist_deadline(drain_timeout)
        files = {session.paths.worker_drain(job_id): (f"deadline={int(deadline)}\n", 0o600)}
        signalled = session.io.signal_batch(job_id, DRAIN_SIGNAL, files)
        now = snapshot.observed_at or session.io.read().now
        nodes = _hosts(self._joined())
        if not signalled:
            self.out.info(f"Worker allocation {job_id} ended before its drain signal arrived")
        else:
            self.out.info(
                f"Draining worker allocation {job_id}"
                + (f" (nodes {', '.join(nodes)})" if nodes else "")
                + ": Ray places no new work there, running tasks and actors go on; each "
                f"node leaves once idle, and what still runs in {max(0.0, deadline - now):.0f} "
                "s (drain_timeout) is stopped")
        return deadline

    def _persist_deadline(self, drain_timeout: float) -> float:
        session, job_id = self.session, self.job_id
        for _attempt in range(5):
            doc = session.io.read().doc
            decided = wt.request_worker_drain(doc, job_id=job_id, drain_timeout=drain_timeout)
            if isinstance(decided, tr.Change):
                result = session.io.apply(decided)
                if result.ok:
                    stored = tr.document(result.doc, session.job_name)
                    return _deadline_of(stored, job_id, decided)
                continue  # the record changed meanwhile: decide again on a new read
            record = doc.workers.get(job_id) if doc is not None else None
            if record is not None and record.drain_deadline is not None and not record.released:
                self.out.info(f"Worker allocation {job_id} drains already; its deadline "
                              f"({record.drain_deadline:.0f}, epoch seconds) is kept")
                return float(record.drain_deadline)
            raise SessionError(f"worker allocation {job_id} was not drained: {decided.reason}")
        raise SessionError(f"worker allocation {job_id} was not drained: its record in the "
                           "session document kept changing; call remove_worker_allocation() "
                           "again")

    def _move_head(self, deadline: float) -> None:
        """Elect the next head while this allocation, which hosts the current one, drains
        (the document shows its drain deadline, so the election does not keep it). The
        drain goes on whatever the election's outcome: a failed election is logged, the
        next head check elects again."""
        from dagster_slurm.session.head.election import replace_head

        self.out.info(f"Worker allocation {self.job_id} hosts the Ray head of "
                      f"{self.session.job_name}: electing another head before it leaves")
        try:
            replace_head(self.session, logger=self.out)
        except DagsterSlurmError as exc:
            self.out.warning(f"The head of {self.session.job_name} was not moved off worker "
                             f"allocation {self.job_id} ({exc}); its drain goes on and the "
                             "next head check elects again")

    # -- following the job ------------------------------------------------------------------
    def follow_quietly(self, deadline: float | None, snapshot: StatusSnapshot) -> None:
        """:meth:`follow` in a background thread: errors are logged, never raised."""
        try:
            self.follow(deadline, snapshot, lambda seconds, _what: self.session.sleep(seconds))
        except Exception as exc:  # noqa: BLE001 - a daemon thread: logged for the operator
            self.out.error(f"Following the removal of worker allocation {self.job_id} "
                           f"stopped: {type(exc).__name__}: {exc}; call "
                           "remove_worker_allocation() again to follow it")

    def follow(self, deadline: float | None, snapshot: StatusSnapshot,
               pause: Callable[[float, str], None]) -> JobState:
        """Poll until the job has left the queue (cancelling it once ``deadline`` + the grace
        passed while it still runs; ``deadline`` None: no drain, nothing to cancel); record
        the release and return the final state."""
        session, job_id = self.session, self.job_id
        if self.hand_over and deadline is not None:
            self._move_head(deadline)
        backoff = PollBackoff(initial=1.0, maximum=5.0, factor=1.5)
        cancelled = False
        told, last_nodes = -math.inf, None
        nodes_read, nodes = -math.inf, None
        while snapshot.ended_state(job_id) is None:
            observed = snapshot.job(job_id)
            now = snapshot.observed_at if snapshot.observed_at is not None else time.time()
            changed = False
            if deadline is not None and not cancelled and now > deadline + DRAIN_GRACE \
                    and observed.state is not None and observed.state.active \
                    and observed.state not in (JobState.COMPLETING, JobState.STAGE_OUT):
                self.out.warning(
                    f"Worker allocation {job_id} still runs {now - deadline:.0f} s after its "
                    f"drain deadline ({observed.state.value}); cancelling it "
                    f"(scancel {job_id})")
                session.io.cancel([job_id])
                cancelled, changed = True, True
            elif deadline is not None and session.clock() - nodes_read >= NODES_INTERVAL:
                nodes_read, nodes = session.clock(), _hosts(self._joined())
            if nodes != last_nodes or session.clock() - told >= PROGRESS_INTERVAL:
                changed = changed or nodes != last_nodes
                told, last_nodes = session.clock(), nodes
                self.out.info(self._progress(observed.state, nodes, deadline, now, cancelled))
            pause(backoff.observe(changed), f"worker allocation {job_id}")
            snapshot = self.observe(pause)
        return self.settle(snapshot)

    def _progress(self, state: JobState | None, nodes: list[str] | None,
                  deadline: float | None, now: float, cancelled: bool) -> str:
        job_id = self.job_id
        told = state.value if state is not None else "state unknown"
        if deadline is None or cancelled:
            return f"Waiting for worker allocation {job_id} to end ({told})"
        joined = ("no node joined" if not nodes
                  else f"{len(nodes)} node(s) still in the Ray cluster: {', '.join(nodes)}")
        left = deadline - now
        when = (f"deadline in {left:.0f} s" if left >= 0
                else f"deadline passed {-left:.0f} s ago; cancelled {DRAIN_GRACE:g} s after it")
        return f"Worker allocation {job_id} drains ({told}; {joined}; {when})"

    def _joined(self) -> list[str] | None:
        """The lines of the allocation's ``ray_nodes`` file (None: unreadable)."""
        try:
            return self.session.io.read_lines(self.session.paths.ray_nodes(self.job_id))
        except DagsterSlurmError as exc:
            log.debug("ray_nodes of worker allocation %s unreadable: %s", self.job_id, exc)
            return None

    def settle(self, snapshot: StatusSnapshot) -> JobState:
        """The job has left the queue: its final state (accounting, else squeue, else
        UNKNOWN), recorded with its release."""
        session, job_id = self.session, self.job_id
        observed = snapshot.job(job_id)
        seen = observed.state if observed.state is not None and observed.state.terminal else None

        def read() -> SacctRecord | None:
            return session.io.accounting([job_id]).get(job_id)

        answer = read_until_final(
            read, lambda record: record is not None and record.state.terminal,
            deadline=0.0 if seen is not None else ACCOUNTING_DEADLINE,
            clock=session.clock, sleep=session.sleep,
        )
        record = answer.value
        state = record.state if record is not None and record.state.terminal else seen
        if state is None:
            state = JobState.UNKNOWN
            self.out.warning(f"Worker allocation {job_id} has left the queue, but neither squeue "
                             "nor sacct says how it ended; recorded as released, state UNKNOWN")
        self._release(state)
        self.out.info(f"Worker allocation {job_id} ended {state.value}; released from the "
                      f"session {session.job_name}")
        return state

    def _release(self, state: JobState) -> None:
        session = self.session
        for _attempt in range(5):
            decided = wt.release_worker(session.io.read().doc, job_id=self.job_id,
                                        final_state=state.value)
            if isinstance(decided, tr.Refused) or session.io.apply(decided).ok:
                return  # released (now, or by another process)
        log.warning("could not record the release of worker allocation %s: its record kept "
                    "changing", self.job_id)


def _deadline_of(doc: SessionDocument | None, job_id: str, decided: tr.Change) -> float:
    record = doc.workers.get(job_id) if doc is not None else None
    if record is None or record.drain_deadline is None:
        raise SessionError(f"the drain deadline of worker allocation {job_id} was not found "
                           f"after {decided.transition}; call remove_worker_allocation() again")
    return float(record.drain_deadline)


def _hosts(lines: list[str] | None) -> list[str] | None:
    """The host names of ``ray_nodes`` lines (``<host> <ray node id> <head job id>``)."""
    if lines is None:
        return None
    return [line.split()[0] for line in lines if line.split()]


class _SafeLog(ProgressLog):
    """A :class:`ProgressLog` that falls back to the Python logger when the given one fails
    (a Dagster step's log used from a thread after the step returned)."""

    def emit(self, level: str, message: str) -> None:
        try:
            super().emit(level, message)
        except Exception:  # noqa: BLE001 - the line still reaches the Python logger
            getattr(log, level)(message)


# -- teardown -----------------------------------------------------------------------------------
def release_at_close(session: SessionContext) -> None:
    """Record every live worker allocation of the closed session as released (teardown
    cancelled them by the session's job name); retried on a conflicting write, logged when
    it does not take."""
    for _attempt in range(5):
        decided = wt.release_live_workers(session.io.read().doc)
        if decided is None or session.io.apply(decided).ok:
            return
    log.warning("could not record the release of the worker allocations of %s: the session "
                "document kept changing", session.job_name)
