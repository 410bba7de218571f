"""Who should host the session's Ray head: a pure function of (document, scheduler, time).

:func:`choose_head` reads the session document, a :class:`SchedulerView` (what squeue said
about the session's jobs, and whether each head's Ray answered) and the time, and returns a
:class:`HeadChoice`:

* ``KEEP`` — the head is healthy: its job runs, its Ray answers, it does not drain (a
  head hosted by a worker allocation also drains when that allocation does: its removal
  was requested, or its step server recorded a drain);
* ``WAIT`` — someone else's election claim has not expired, a head is being submitted or
  starting, or the scheduler's answer is uncertain (an unknown never elects a head);
* ``SUCCESSOR`` — a published successor runs: it becomes the head;
* ``WORKER`` — the running, undrained worker allocation with the most time left hosts a
  head-only control plane on its first node (among those with the fewest failed head
  starts there; passed over after :data:`~dagster_slurm.state.election_transitions.FAILED_TWICE`,
  never with the port strategy ``fixed``, never a released one, never the failed head's
  own allocation);
* ``NEW_ALLOCATION`` — nothing can host it: submit an allocation shaped like the first head;
* ``CLOSED`` — the session was closed: nothing is elected.

The function is deterministic (ties in time left go to the lower job id) and never
returns two heads: it names one job at most. Acting on the choice is the caller's: claim
the election (:func:`~dagster_slurm.state.election_transitions.claim_election` with
``choice.job_id`` as candidate), start the head, then complete or fail the claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from dagster_slurm.slurm.parsers import SqueueRecord
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state.election_transitions import (
    FAILED_TWICE,
    WORKER_HEAD_KIND,
    ClaimState,
    claim_state,
    failures,
)
from dagster_slurm.state.schema import SessionDocument
from dagster_slurm.state.transitions import HeadState, head_state

ENDING_STATES: frozenset[JobState] = frozenset({JobState.COMPLETING, JobState.STAGE_OUT})
"""States of a job that has ended and is being cleaned up: it never runs again, so a head
in one of them is replaced without waiting for its last processes to be killed."""

HANDOVER_LEAD = 300.0
"""Seconds before its walltime a head without a pre-walltime signal is drained; a worker
allocation with no more time left than this is not elected (it would hand over at once)."""


@dataclass(frozen=True)
class JobView:
    """What the scheduler said about one job.

    ``state`` is None when unknown; ``end_at`` the expected end (epoch seconds, login node
    clock; ``inf`` without a limit, None unknown); ``nodes`` its nodes in order (empty while
    pending or unknown); ``ray_alive`` whether a head's Ray answered (None: not checked);
    ``drained`` True when the allocation drains itself (e.g. on its pre-walltime signal):
    the step server of a worker allocation that hosts the head recorded a drain, or a worker
    allocation's own state says it drains or was released (False: not seen).
    """

    state: JobState | None
    end_at: float | None = None
    nodes: tuple[str, ...] = ()
    ray_alive: bool | None = None
    drained: bool = False


@dataclass(frozen=True)
class SchedulerView:
    """The session's jobs at one scheduler poll. ``certain`` is False when squeue failed:
    then a job's absence means nothing. A job missing from a certain view has ended."""

    jobs: Mapping[str, JobView] = field(default_factory=dict)
    certain: bool = True

    @classmethod
    def from_squeue(cls, records: Mapping[str, SqueueRecord], *, observed_at: float,
                    certain: bool = True,
                    ray_alive: Mapping[str, bool] | None = None,
                    drained: frozenset[str] = frozenset()) -> SchedulerView:
        """A view of squeue ``records`` read at ``observed_at`` (epoch seconds): the end is
        the time left counted from then (else squeue's end time). ``drained``: job ids of
        the allocations that drain themselves (see :class:`JobView`)."""
        alive = ray_alive or {}
        jobs = {}
        for job_id, rec in records.items():
            end: float | None = None
            if rec.time_left_seconds is not None:
                end = observed_at + rec.time_left_seconds
            elif rec.end_time is not None:
                end = rec.end_time.timestamp()
            jobs[job_id] = JobView(rec.state, end, tuple(rec.nodes or ()), alive.get(job_id),
                                   job_id in drained)
        return cls(jobs, certain)


class HeadChoiceKind(str, Enum):
    """What :func:`choose_head` decided."""

    KEEP = "keep"
    """The current head is healthy; nothing changes."""
    WAIT = "wait"
    """Another elector's claim holds, a head is starting, or the scheduler is uncertain."""
    SUCCESSOR = "successor"
    """The running published successor becomes the head."""
    WORKER = "worker"
    """A worker allocation hosts the head on its first node."""
    NEW_ALLOCATION = "new_allocation"
    """Submit a new allocation shaped like the session's first head."""
    CLOSED = "closed"
    """The session is closed: no head is elected."""


@dataclass(frozen=True)
class HeadChoice:
    """The decision, with ``reason`` in words for the log.

    ``job_id``: the head kept, the successor or the worker allocation chosen (None for the
    other kinds); ``node``: the worker allocation's first node, where the control plane
    starts; ``term``: the election term a claim for this choice takes (the current one for
    KEEP and WAIT); ``wait_until``: when a live claim expires (WAIT only, else None);
    ``replaces``: the job id of the head being replaced (None when there is none).
    """

    kind: HeadChoiceKind
    reason: str
    job_id: str | None = None
    node: str | None = None
    term: int = 0
    wait_until: float | None = None
    replaces: str | None = None


def _running(view: JobView | None) -> bool:
    return view is not None and view.state is JobState.RUNNING


def _time_left(view: JobView, now: float) -> float | None:
    return None if view.end_at is None else view.end_at - now


def _job_order(job_id: str) -> tuple[int, str]:
    return (len(job_id), job_id)


def _head_verdict(doc: SessionDocument, view: SchedulerView,
                  term: int) -> HeadChoice | str | None:
    """KEEP or WAIT for the current head; else why it must be replaced (None: no head)."""
    record = doc.allocation
    state = head_state(doc)
    if record is None or state in (HeadState.ABSENT, HeadState.FAILED, HeadState.IN_DOUBT):
        return None
    if state is HeadState.SUBMITTING:
        return HeadChoice(HeadChoiceKind.WAIT, "the head allocation is being submitted",
                          term=term)
    if state is HeadState.UNRECOGNIZED:
        return HeadChoice(HeadChoiceKind.WAIT, f"the head record has status {record.status!r}, "
                          "which this library does not know", term=term)
    job_id = str(record.job_id)
    job = view.jobs.get(job_id)
    if job is None:
        return f"the head allocation (job {job_id}) has ended"
    if job.state is None:
        return HeadChoice(HeadChoiceKind.WAIT, f"the state of the head allocation (job "
                          f"{job_id}) is unknown", job_id=job_id, term=term)
    if job.state.terminal:
        return f"the head allocation (job {job_id}) ended {job.state.value}"
    if job.state in ENDING_STATES:
        # after its end (a cancel, the walltime): processes are still being killed
        return f"the head allocation (job {job_id}) is ending ({job.state.value})"
    if state is HeadState.DRAINING:
        return f"the head allocation (job {job_id}) drains"
    if hosting_worker_drains(doc) or (record.kind == WORKER_HEAD_KIND and job.drained):
        return f"worker allocation {job_id}, which hosts the head, drains"
    if job.ray_alive is False:
        return f"the Ray head of job {job_id} stopped while the job runs"
    if state is HeadState.SUBMITTED or not _running(job):
        return HeadChoice(HeadChoiceKind.WAIT, f"the head allocation (job {job_id}) is "
                          f"not running yet ({job.state.value})", job_id=job_id, term=term)
    return HeadChoice(HeadChoiceKind.KEEP, f"the head allocation (job {job_id}) is healthy",
                      job_id=job_id, term=term)


def hosting_worker_drains(doc: SessionDocument | None) -> bool:
    """True when the head is hosted by a worker allocation (kind
    :data:`~dagster_slurm.state.election_transitions.WORKER_HEAD_KIND`) whose drain the
    session requested (its worker record has a drain deadline): the head must move before
    that allocation ends."""
    record = doc.allocation if doc is not None else None
    if record is None or record.kind != WORKER_HEAD_KIND or record.job_id is None:
        return False
    worker = doc.workers.get(str(record.job_id)) if doc is not None else None
    return worker is not None and worker.drain_deadline is not None


def eligible_workers(doc: SessionDocument, view: SchedulerView, now: float, *,
                     port_strategy: str = "random") -> list[str]:
    """Job ids of the worker allocations that may host the head, best first: running,
    undrained (neither by the session nor by itself), not released, not the current head's
    allocation, with a known first node, more than :data:`HANDOVER_LEAD` seconds left (or an
    unknown time left), fewer than :data:`FAILED_TWICE` failed head starts; ordered by failed
    starts, then most time left (unknown last), then job id. Empty with the port strategy
    ``fixed``."""
    if port_strategy == "fixed":
        return []
    head = doc.allocation.job_id if doc.allocation is not None else None
    ranked: list[tuple[int, float, tuple[int, str], str]] = []
    for job_id, record in doc.workers.items():
        job = view.jobs.get(job_id)
        if record.released or record.drain_deadline is not None or job_id == head:
            continue
        if not _running(job) or failures(doc, job_id) >= FAILED_TWICE:
            continue
        assert job is not None
        if job.drained:
            continue
        if not (job.nodes or record.nodes):
            continue
        left = _time_left(job, now)
        if left is not None and left <= HANDOVER_LEAD:
            continue
        ranked.append((failures(doc, job_id), -(left if left is not None else float("-inf")),
                       _job_order(job_id), job_id))
    return [entry[-1] for entry in sorted(ranked)]


def choose_head(doc: SessionDocument | None, view: SchedulerView, now: float, *,
                port_strategy: str = "random", hosts_on_workers: bool = True) -> HeadChoice:
    """The session's head at ``now`` (epoch seconds, the store's clock): see the module
    docstring for the order. ``port_strategy`` is the run's Ray launcher's;
    ``hosts_on_workers`` False: no worker allocation is offered as a host (the caller
    cannot start a control plane on one), as with the port strategy ``fixed``."""
    if doc is None:
        return HeadChoice(HeadChoiceKind.NEW_ALLOCATION, "the session has no document yet",
                          term=1)
    if doc.closed:
        return HeadChoice(HeadChoiceKind.CLOSED, "the session is closed")
    election = doc.election
    term = election.term if election is not None else 0
    if election is not None and claim_state(doc, now) is ClaimState.CLAIMED:
        return HeadChoice(HeadChoiceKind.WAIT, f"{election.claimed_by} elects the head of "
                          f"term {election.term}", job_id=election.candidate, term=term,
                          wait_until=election.expires_at)
    if not view.certain:
        return HeadChoice(HeadChoiceKind.WAIT, "the scheduler's answer is uncertain",
                          term=term)
    verdict = _head_verdict(doc, view, term)
    if isinstance(verdict, HeadChoice):
        return verdict
    gone = verdict or "the session has no head allocation"
    replaces = doc.allocation.job_id if verdict is not None and doc.allocation else None
    successor = doc.successor
    if (successor is not None and successor.status == "submitted" and successor.job_id
            and successor.drain_requested_at is None
            and _running(view.jobs.get(successor.job_id))
            and failures(doc, successor.job_id) < FAILED_TWICE):
        return HeadChoice(HeadChoiceKind.SUCCESSOR, f"{gone}; the published successor (job "
                          f"{successor.job_id}) runs", job_id=successor.job_id,
                          term=term + 1, replaces=replaces)
    workers = (eligible_workers(doc, view, now, port_strategy=port_strategy)
               if hosts_on_workers else [])
    if workers:
        job_id = workers[0]
        job = view.jobs[job_id]
        node = (job.nodes or tuple(doc.workers[job_id].nodes))[0]
        left = _time_left(job, now)
        told = "an unknown time" if left is None else f"{left:.0f} s"
        return HeadChoice(HeadChoiceKind.WORKER, f"{gone}; worker allocation {job_id} has the "
                          f"most time left ({told}) and hosts the head on {node}",
                          job_id=job_id, node=node, term=term + 1, replaces=replaces)
    why = ("port_strategy 'fixed' lets no worker allocation host it" if port_strategy == "fixed"
           else "no running, undrained worker allocation can host it" if hosts_on_workers
           else "worker allocations do not host heads here")
    return HeadChoice(HeadChoiceKind.NEW_ALLOCATION, f"{gone}; {why}: a new allocation shaped "
                      "like the first head is submitted", term=term + 1, replaces=replaces)


# -- when to act ---------------------------------------------------------------------------------
HEAD_CHECK_INTERVAL = 30.0
"""Seconds between a step process's checks of the head, once the session has a worker
allocation or a separate head."""

WORKER_DISCOVERY_INTERVAL = 120.0
"""Longest time a step process that started before the session's first worker allocation
takes to notice it (and to start checking the head)."""


def head_drain_due(doc: SessionDocument | None, view: SchedulerView, now: float, *,
                   has_signal: bool) -> bool:
    """True when the head must be drained now because it gets no pre-walltime signal
    (``has_signal`` False: its effective ``signal_before_timeout`` is None) and no more
    than :data:`HANDOVER_LEAD` seconds of its walltime are left. False while anything is
    unknown (state, end time, an uncertain scheduler) or the head drains already."""
    if has_signal or doc is None or not view.certain:
        return False
    if head_state(doc) is not HeadState.READY or doc.allocation is None:
        return False
    job = view.jobs.get(str(doc.allocation.job_id))
    if not _running(job) or job is None or job.end_at is None:
        return False
    return job.end_at - now <= HANDOVER_LEAD


def _alive(view: SchedulerView, job_id: str | None) -> bool:
    """True unless a certain view shows ``job_id`` ended (an unknown counts as alive)."""
    if job_id is None:
        return False
    job = view.jobs.get(job_id)
    if job is None:
        return not view.certain
    return job.state is None or not job.state.terminal


def live_worker_jobs(doc: SessionDocument | None, view: SchedulerView) -> list[str]:
    """Job ids of the worker allocations that are not released and not seen ended."""
    if doc is None:
        return []
    return sorted((job_id for job_id, record in doc.workers.items()
                   if not record.released and _alive(view, job_id)), key=_job_order)


def needs_worker(doc: SessionDocument | None, view: SchedulerView) -> bool:
    """True when a session with worker allocations has none left: no live worker
    allocation, no submission in flight. False while the scheduler is uncertain (an
    unknown never submits) or the session is closed."""
    if doc is None or doc.closed or not view.certain:
        return False
    if live_worker_jobs(doc, view):
        return False
    return not any(submission.status in ("submitting", "unknown")
                   for submission in doc.worker_submissions.values())


def workers_await_head(doc: SessionDocument | None, view: SchedulerView) -> bool:
    """True when live worker allocations wait for a head: the session has no head record,
    or its head's job is seen ended (for the orphan sensor, which treats such a run like one
    with a published successor)."""
    if doc is None or not live_worker_jobs(doc, view):
        return False
    record = doc.allocation
    if record is None or head_state(doc) in (HeadState.FAILED, HeadState.IN_DOUBT):
        return True
    return record.job_id is not None and not _alive(view, record.job_id)
