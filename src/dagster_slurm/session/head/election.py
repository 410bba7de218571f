"""Electing the run's Ray head: :meth:`RunSession.replace_head`, from any process at once.

Each round reads the session document and one squeue of the session's job name, and asks
:func:`~dagster_slurm.state.election.choose_head` what to do:

* ``KEEP`` - the head is healthy: it is returned unchanged (attached to, when this process
  still used an earlier one);
* ``WAIT`` - another process holds the election's claim, a head is being submitted or
  starts, or the scheduler did not answer: wait and read again (an unknown never elects);
* ``SUCCESSOR`` / ``NEW_ALLOCATION`` / ``WORKER`` - claim the election (the first caller
  wins the claim, every other caller waits for the head it elects), then:

  - ``SUCCESSOR``: promote the running published successor
    (:func:`~dagster_slurm.session.head.successor.promote_successor`; while a draining head's
    payload steps still stop at their checkpoint, the promotion is retried);
  - ``NEW_ALLOCATION``: a successor still queued is that new allocation: it is promoted
    once it runs; otherwise the old head record goes to the history (``REPLACED`` while its
    job still runs, else its final state) and a new allocation shaped like the first head
    is submitted and waited for; a draining old head still running is released once the
    new head accepts steps and it has no unfinished step;
  - ``WORKER``: the running, undrained worker allocation with the most time left hosts a
    head-only control plane on its first node
    (:func:`~dagster_slurm.session.head.worker_host.host_on_worker`); installing it as the head
    record releases the claim. When its head does not start, the claim is failed (a
    failure counted for it) and the next round elects again (another worker allocation
    first; one that failed twice is passed over).

  The claim is renewed every half lease while the elector works (a new allocation may wait
  in the queue), and completed once the head accepts steps; when the head does not start,
  the claim is failed (a failure counted for its candidate) and the error propagates. An
  elector that dies blocks the next election for at most the claim's lease
  (:data:`~dagster_slurm.state.election_transitions.CLAIM_TTL`).

``timeout`` bounds the whole call (None: wait as long as it takes); once it passes while
waiting, :class:`HeadElectionTimeout` names what was waited for.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.protocol import WORKER_DRAINING, WORKER_RELEASED
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.session.core.errors import PromotionDeferred, SessionError
from dagster_slurm.session.head.worker_host import WorkerHostFailed, host_on_worker
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import election_transitions as et
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.election import HeadChoice, HeadChoiceKind, SchedulerView, choose_head

if TYPE_CHECKING:
    from dagster_slurm.session.core.allocation import SlurmAllocation
    from dagster_slurm.session.core.context import SessionContext
    from dagster_slurm.state.schema import SessionDocument

log = logging.getLogger("dagster_slurm.session")

#: Seconds between two promotion attempts while a draining head's steps still stop.
PROMOTION_RETRY = 2.0

#: The first words of a worker allocation's state file (``templates/ray_worker.sh``) that
#: say it drains or has let go: it is not asked to host a head.
WORKER_DRAIN_STATES = frozenset({WORKER_DRAINING, WORKER_RELEASED})


class HeadElectionTimeout(SessionError, TimeoutError):
    """``replace_head(timeout=...)`` passed its timeout before a healthy head was there."""


def elector_id() -> str:
    """Who claims an election: host, process id and a random part (two sessions of one
    process elect as different owners)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def scheduler_view(session: SessionContext) -> tuple[SessionDocument | None, SchedulerView, float]:
    """The session document, one squeue of the session's jobs, and the store's clock. With
    Ray, the head's step server's ``ray_stopped`` marker says whether its Ray answers (the
    head's ``ray_alive`` is False once it is there, else not known); for a head hosted by a
    worker allocation, its step server's ``drained`` marker says that allocation drains
    itself, and so does a worker allocation's own state (``draining``, ``released ...``: it
    drains on its pre-walltime signal without the session asking). The markers and states
    are read in one round trip."""
    read = session.io.read()
    snapshot = session.io.queue([session.job_name])
    alive: dict[str, bool] = {}
    drained: set[str] = set()
    doc = read.doc
    head = doc.allocation if doc is not None else None
    head_id = str(head.job_id) if head is not None and head.job_id else None
    asked: dict[str, tuple[str, str]] = {}  # path -> (job id, what it says)
    if session.has_ray and doc is not None:
        if head is not None and head_id is not None and head.status == "submitted":
            asked[session.paths.ray_stopped(head_id)] = (head_id, "ray_stopped")
            if head.kind == et.WORKER_HEAD_KIND:
                asked[session.paths.drained(head_id)] = (head_id, "drained")
        for job_id, worker in doc.workers.items():
            if not worker.released:
                asked[session.paths.worker_state(job_id)] = (job_id, "state")
    if asked:
        texts = session.io.poll_files(session.job_name, head_id or "", list(asked),
                                      with_status=False).texts
        for path, (job_id, kind) in asked.items():
            text = (texts.get(path) or "").strip()
            if kind == "ray_stopped" and text:
                alive[job_id] = False
            elif kind == "drained" and text:
                drained.add(job_id)
            elif kind == "state" and text.split(" ", 1)[0] in WORKER_DRAIN_STATES:
                drained.add(job_id)
    view = SchedulerView.from_squeue(snapshot.queue, observed_at=snapshot.observed_at or read.now,
                                     certain=snapshot.certain, ray_alive=alive,
                                     drained=frozenset(drained))
    return read.doc, view, read.now


def _port_strategy(session: SessionContext) -> str:
    return str(getattr(session.launcher, "port_strategy", "random"))


def replace_head(session: SessionContext, timeout: float | None = None,
                 logger: Any = None) -> SlurmAllocation:
    """The session's healthy head, electing one first if it has none; see the module
    docstring."""
    out = ProgressLog(logger)
    deadline = None if timeout is None else session.clock() + timeout
    owner = elector_id()
    backoff = PollBackoff(initial=0.5, maximum=5.0, factor=1.5)
    told = ""
    while True:
        doc, view, now = scheduler_view(session)
        choice = choose_head(doc, view, now, port_strategy=_port_strategy(session),
                             hosts_on_workers=True)
        kind = choice.kind
        if kind is HeadChoiceKind.CLOSED:
            raise SessionError(tr.closed_message(doc, session.job_name))
        if kind is HeadChoiceKind.KEEP or _orphaned_start(doc, view, now):
            assert choice.job_id is not None
            return _keep(session, choice.job_id, out)
        if kind is not HeadChoiceKind.WAIT:
            decided = et.claim_election(doc, owner=owner, candidate=choice.job_id, now=now,
                                        ttl=et.CLAIM_TTL)
            if isinstance(decided, tr.Change) and session.io.apply(decided).ok:
                out.info(f"Electing the head of {session.job_name} (term {choice.term}): "
                         f"{choice.reason}")
                try:
                    return _elect(session, doc, choice, owner, deadline, out)
                except WorkerHostFailed as exc:  # the claim was failed: elect again
                    out.warning(f"{exc}; electing again")
                    continue
            # another caller claimed it first: wait for the head it elects
        if choice.reason != told:
            told = choice.reason
            out.info(f"Waiting for the head of {session.job_name}: {choice.reason}")
        _pause(session, backoff, deadline, choice.reason)


def _pause(session: SessionContext, backoff: PollBackoff, deadline: float | None, why: str) -> None:
    delay = backoff.observe(False)
    if deadline is not None:
        left = deadline - session.clock()
        if left <= 0:
            raise HeadElectionTimeout(
                f"no healthy head for {session.job_name} within the timeout (last: {why}); "
                "call replace_head() again, or check the session's allocations with squeue "
                f"--name={session.job_name}")
        delay = min(delay, left)
    session.pause(delay, "the election of the run's Ray head")


def _orphaned_start(doc: SessionDocument | None, view: SchedulerView, now: float) -> bool:
    """True when the head record is a submitted allocation whose job RUNS while nobody
    holds the election's claim: its submitter (an elector that died, say) is not there to
    record it ready, so this caller attaches to it (and records it)."""
    if doc is None or doc.allocation is None or not doc.allocation.job_id:
        return False
    if tr.head_state(doc) is not tr.HeadState.SUBMITTED:
        return False
    if et.claim_state(doc, now) is et.ClaimState.CLAIMED:
        return False
    job = view.jobs.get(str(doc.allocation.job_id))
    return job is not None and job.state is JobState.RUNNING


def _keep(session: SessionContext, job_id: str, out: ProgressLog) -> SlurmAllocation:
    """The head ``job_id``, attached to (a cached allocation of an earlier head is dropped);
    a head record still ``submitted`` is recorded ready (its submitter may be gone)."""
    session.current.drop(unless_job=job_id)
    allocation = session.ensure(out.logger)
    read = session.io.read()
    if read.doc is not None and tr.head_state(read.doc) is tr.HeadState.SUBMITTED:
        decided = tr.record_ready(read.doc, job_id=allocation.job_id, nodes=allocation.nodes,
                                  ray_address=allocation.ray_address)
        if isinstance(decided, tr.Change):
            session.io.apply(decided)  # guarded: a concurrent recorder wins, nothing lost
    return allocation


class ClaimKeeper(threading.Thread):
    """Renews the elector's claim every half lease until stopped (a daemon thread of the
    call that elects; it ends with it)."""

    def __init__(self, session: SessionContext, owner: str, term: int,
                 ttl: float = et.CLAIM_TTL) -> None:
        super().__init__(name=f"dagster-slurm-election-{session.job_name}", daemon=True)
        self.session, self.owner, self.term, self.ttl = session, owner, term, ttl
        self.lost = False
        self._stop_event = threading.Event()

    def renew_once(self) -> bool:
        """One renewal; False once the claim is no longer this elector's."""
        read = self.session.io.read()
        decided = et.renew_election(read.doc, owner=self.owner, term=self.term, now=read.now,
                                    ttl=self.ttl)
        if isinstance(decided, tr.Refused) or not self.session.io.apply(decided).ok:
            self.lost = True
            log.warning("the election claim of term %s for %s was lost: %s", self.term,
                        self.session.job_name,
                        decided.reason if isinstance(decided, tr.Refused) else "it changed")
            return False
        return True

    def run(self) -> None:
        while not self._stop_event.wait(self.ttl / 2):
            try:
                if not self.renew_once():
                    return
            except DagsterSlurmError as exc:  # retried at the next half lease
                log.warning("could not renew the election claim of %s: %s",
                            self.session.job_name, exc)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)


def _elect(session: SessionContext, doc: SessionDocument | None, choice: HeadChoice, owner: str,
           deadline: float | None, out: ProgressLog) -> SlurmAllocation:
    """Act on ``choice`` under the claim of ``owner``; complete or fail the claim."""
    keeper = ClaimKeeper(session, owner, choice.term, et.CLAIM_TTL)
    keeper.start()
    try:
        if choice.kind is HeadChoiceKind.WORKER:
            allocation = host_on_worker(session, choice, owner, deadline, out)
            keeper.stop()  # installing the head released the claim
            out.info(f"Head of {session.job_name} elected: worker allocation "
                     f"{allocation.job_id}, Ray at {allocation.ray_address}")
            return allocation
        if choice.kind is HeadChoiceKind.SUCCESSOR:
            allocation = _promote(session, deadline, out, wait=None)
        elif doc is not None and doc.successor is not None and doc.successor.job_id:
            # a queued successor is the new allocation shaped like the head: promote it
            wait = None if deadline is None else max(0.0, deadline - session.clock())
            allocation = _promote(session, deadline, out, wait=wait if wait is not None
                                  else 365 * 86400.0)
        else:
            allocation = _new_allocation(session, doc, out)
    except BaseException:
        keeper.stop()
        _finish_claim(session, owner, choice.term, failed=True)
        raise
    keeper.stop()
    _finish_claim(session, owner, choice.term, failed=False)
    out.info(f"Head of {session.job_name} elected: allocation {allocation.job_id}"
             + (f", Ray at {allocation.ray_address}" if allocation.ray_address else ""))
    return allocation


def _promote(session: SessionContext, deadline: float | None, out: ProgressLog,
             wait: float | None) -> SlurmAllocation:
    """Promote the successor; retried while the draining head's steps still stop."""
    from dagster_slurm.session.head.successor import promote_successor

    backoff = PollBackoff(initial=PROMOTION_RETRY, maximum=10.0, factor=1.5)
    while True:
        try:
            return promote_successor(session, logger=out.logger, wait=wait)
        except PromotionDeferred as exc:
            _pause(session, backoff, deadline, str(exc))
            wait = None


def _new_allocation(session: SessionContext, doc: SessionDocument | None,
                    out: ProgressLog) -> SlurmAllocation:
    """Retire the old head record and submit (and wait for) a new head allocation."""
    old = doc.allocation if doc is not None else None
    old_job = str(old.job_id) if old is not None and old.job_id else None
    still_runs = False
    if old is not None:
        snapshot = session.io.queue([session.job_name])
        ended = snapshot.ended_state(old_job) if old_job else None
        still_runs = old_job is not None and ended is None and snapshot.certain
        state = ended or ("REPLACED" if still_runs else None)
        session.retire(old_job or old.token, "job_id" if old_job else "token", state)
    session.current.drop()
    allocation = session.ensure(out.logger)
    if still_runs and old_job is not None and old is not None \
            and old.kind == et.WORKER_HEAD_KIND:
        out.info(f"Worker allocation {old_job} no longer hosts the head; it stays a worker")
    elif still_runs and old_job is not None:
        _release_old_head(session, old_job, out)
    return allocation


def _release_old_head(session: SessionContext, job_id: str, out: ProgressLog) -> None:
    """Cancel the replaced head ``job_id`` (it drained, or its Ray stopped) once it has no
    unfinished step; one that still has one stays (its walltime or teardown ends it)."""
    try:
        steps = session.io.active_steps(job_id)
    except DagsterSlurmError as exc:
        out.warning(f"the replaced head allocation {job_id} was not released: its steps could "
                    f"not be listed ({exc}); teardown ends it")
        return
    if steps:
        out.warning(f"the replaced head allocation {job_id} still has {len(steps)} unfinished "
                    "step(s); it stays until they end (teardown or its walltime ends it)")
        return
    session.cancel_quietly(job_id, out)


def _finish_claim(session: SessionContext, owner: str, term: int, *, failed: bool) -> None:
    """Complete (or fail) the claim of ``owner``'s ``term``; a claim already gone (another
    elector took over) is left alone."""
    for _attempt in range(5):
        try:
            read = session.io.read()
            transition = et.fail_election if failed else et.complete_election
            decided = transition(read.doc, owner=owner, term=term, now=read.now)
            if isinstance(decided, tr.Refused):
                if not failed:
                    log.warning("election of term %s for %s: %s", term, session.job_name,
                                decided.reason)
                return
            if session.io.apply(decided).ok:
                return
        except DagsterSlurmError as exc:
            log.warning("could not %s the election claim of term %s for %s: %s",
                        "fail" if failed else "complete", term, session.job_name, exc)
            return
    log.warning("the election record of %s kept changing; its claim expires by itself",
                session.job_name)
