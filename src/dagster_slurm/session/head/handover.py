"""Waiting for a queued successor to start, for ``promote_successor(wait=...)``.

A successor often waits for the very nodes its predecessor holds (same partition, the whole
of it, or a busy cluster where the predecessor's nodes are the first to come free). A
drained predecessor starts no payload any more, so keeping it only delays the successor:
while the successor is PENDING and the predecessor is drained (a drain was requested, or
its step server recorded a drain signal) with no unfinished payload step, the predecessor
is released (cancelled) once. A predecessor that is not drained is never released here: it
may still be doing work the application wants (promotion releases it once the successor
runs).

While waiting, the successor's pending reason and the scheduler's start estimate are logged
when they change (and every few minutes), the run is followed (a run that ended stops the
wait) and the supervisor heartbeat goes on. A scheduler that does not answer is waited out,
never taken as an end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.jobs.pending import PendingTracker
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.slurm.states import JobState

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext
    from dagster_slurm.state.schema import SessionDocument

#: Seconds after releasing the predecessor during which the wait also reads whether the
#: successor started (its output file), between two squeue polls: it usually starts within
#: seconds then, on the nodes just freed.
START_WATCH = 60.0

#: Seconds between those reads (one round trip to the login node each, no scheduler call).
START_POLL_INTERVAL = 0.2


def await_running(session: SessionContext, job_id: str, predecessor: str | None,
                  doc: SessionDocument, wait: float, out: ProgressLog) -> None:
    """Return once successor ``job_id`` is RUNNING; raise :class:`SessionError` when it
    ended first or did not start within ``wait`` seconds (it stays queued: promoting later
    or teardown decides)."""
    tracker = PendingTracker(job_id, session.pending, out.info)
    backoff = PollBackoff(initial=1.0, maximum=15.0, factor=1.5)
    deadline = session.clock() + wait
    released = predecessor is None
    released_at: float | None = None
    drained = predecessor is not None and _drain_recorded(doc, predecessor)
    last = "the scheduler has not answered yet"
    while True:
        snapshot = session.io.queue([session.job_name])
        if snapshot.certain:
            ended = snapshot.ended_state(job_id)
            if ended is not None:
                raise SessionError(f"the successor allocation {job_id} ended ({ended}) before "
                                   "it started; submit another with submit_successor()")
            observed = snapshot.job(job_id)
            if observed.state is JobState.RUNNING:
                out.info(f"Successor allocation {job_id} runs; promoting it")
                return
            tracker(observed)
            if observed.state is not None:
                last = observed.state.value + (f", reason {observed.reason}"
                                               if observed.reason else "")
            if not released and observed.state is not None and observed.state.pending:
                assert predecessor is not None
                drained = drained or _drain_marked(session, predecessor)
                if drained:
                    released = _release(session, snapshot, predecessor, job_id, out)
                    released_at = session.clock() if released else None
        else:
            out.warning(f"the scheduler did not answer ({snapshot.error}); still waiting for "
                        f"successor allocation {job_id}")
        if session.clock() >= deadline:
            raise SessionError(f"the successor allocation {job_id} did not start within "
                               f"{wait:g} s (wait; last seen {last}); it stays queued: call "
                               "promote_successor() again later, or teardown cancels it")
        delay = min(backoff.observe(False), max(0.0, deadline - session.clock()))
        if released_at is not None and session.clock() - released_at < START_WATCH:
            _watch_start(session, job_id, delay)
        else:
            session.pause(delay, f"successor allocation {job_id}")


def _watch_start(session: SessionContext, job_id: str, seconds: float) -> None:
    """Pause up to ``seconds``, reading every :data:`START_POLL_INTERVAL` seconds whether
    the successor's output file exists (Slurm creates it as the job starts); return early
    once it does, for squeue to confirm at once."""
    until = session.clock() + seconds
    path = session.paths.output_of(job_id)
    while (remaining := until - session.clock()) > 0:
        session.pause(min(START_POLL_INTERVAL, remaining), f"successor allocation {job_id}")
        if session.io.poll_files(session.job_name, job_id, [path],
                                 with_status=False).texts[path] is not None:
            return


def release_allocation(session: SessionContext, job_id: str) -> None:
    """Cancel allocation ``job_id``, which runs no payload step, so that it leaves its nodes
    at once.

    First HUP goes to its steps (``scancel --signal=HUP``), which are its Ray nodes: Ray's
    processes end at once (HUP's default action; on TERM a Ray node stops its processes one
    after the other, about 3 s for a head), and each node's shell then removes its Ray
    temp dir and ends. A plain ``scancel`` sends TERM, which is also the allocation's drain
    signal by default: its batch shell and step server would take it as a drain and stay
    until Slurm's KillWait (30 s on many sites) ends them with SIGKILL. So when the drain
    signal is TERM, HUP goes to the batch shell next (``scancel --batch --signal=HUP``): the
    step server leaves and the batch shell ends. The ``scancel`` that follows makes the job
    CANCELLED and signals whatever is left."""
    if session.io.signal_steps(job_id, "HUP"):  # False: it ended already
        if session.drain_signal == "TERM":
            session.io.signal_batch(job_id, "HUP")
    session.io.cancel([job_id])


def _drain_recorded(doc: SessionDocument, predecessor: str) -> bool:
    head = doc.allocation
    return (head is not None and str(head.job_id) == predecessor
            and head.drain_requested_at is not None)


def _drain_marked(session: SessionContext, predecessor: str) -> bool:
    """Whether the predecessor's step server recorded a drain (its pre-walltime signal)."""
    return bool(session.io.read_lines(session.paths.drained(predecessor)))


def _release(session: SessionContext, snapshot: StatusSnapshot, predecessor: str, job_id: str,
             out: ProgressLog) -> bool:
    """Cancel the drained ``predecessor`` unless a payload step of it is unfinished; whether
    it is released (or already gone)."""
    observed = snapshot.job(predecessor)
    if snapshot.ended_state(predecessor) is not None or (
            observed.state is not None and not observed.state.active):
        return True
    steps = session.io.active_steps(predecessor)
    if steps:
        return False  # looked at again on the next poll
    release_allocation(session, predecessor)
    out.info(f"Released the drained allocation {predecessor}: its successor {job_id} is "
             "PENDING and may need its nodes")
    return True
