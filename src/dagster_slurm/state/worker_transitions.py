"""Worker allocations' bookkeeping, as named pure transitions over their own table.

A worker allocation is recorded twice: under its token in ``/worker_submissions`` before
sbatch runs (:func:`submit_worker`), and, once sbatch answered a job id, under that id in
``/workers`` (:func:`worker_submitted`, or :func:`settle_worker_found` when a vanished
submitter's job is found by its token). The worker record then collects the nodes that
joined and their Ray node ids (:func:`record_worker_joined`, again after each new head),
the drain deadline persisted before a drain starts (:func:`request_worker_drain`) and the
release (:func:`release_worker`). A head that failed to start on a worker allocation is
counted in ``/election/failures`` by the election's transitions
(:mod:`dagster_slurm.state.election_transitions`).

The rules are those of :mod:`dagster_slurm.state.transitions`: a transition is a pure
function ``(doc, inputs) -> Change | Refused``, its patch built from
:mod:`dagster_slurm.state.patches`; every patch starts with the guards its decision relied
on (the record's status, its release and drain fields as read), so two processes applying
the same transition on the same read cannot both succeed: the second fails as a conflict
and, on a re-read, is refused. These transitions need the document
(``doc`` None is refused).

The agent's ``submit`` operation writes the submission and the worker record itself
(``record="/worker_submissions/<token>"``, ``record_value=`` :func:`worker_submission_record`,
``on_submitted=("/workers/{job_id}",`` :func:`worker_record_value` ``)``, ``guards=``
:data:`~dagster_slurm.state.patches.SUBMIT_GUARDS`); :func:`submit_worker` and
:func:`worker_submitted` return the same patches, for the in-memory fakes.

A worker allocation's states (:class:`WorkerState`, derived by :func:`worker_state`)::

    ABSENT -> SUBMITTING -> SUBMITTED -> JOINED -> DRAINING -> RELEASED
                  |   \\        ^   \\________________________/^
                  v    \\-> FAILED / IN_DOUBT (settle_worker_found -> SUBMITTED,
                                             settle_worker_lost -> FAILED)
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from dagster_slurm.agent.remote.patch import make_pointer
from dagster_slurm.state.patches import (
    SUBMIT_GUARDS,
    Change,
    Edge,
    Op,
    Outcome,
    Patch,
    Refused,
    absent,
    add,
    add_now,
    as_read,
    check_edge,
    equals,
    sbatch_failed_ops,
    setdefault,
)
from dagster_slurm.state.schema import SessionDocument, Worker
from dagster_slurm.state.transitions import closed_message


class WorkerState(str, Enum):
    """The state of one worker allocation's records."""

    ABSENT = "absent"
    """Neither a submission under its token nor a worker record."""
    SUBMITTING = "submitting"
    """The token is recorded and sbatch runs (or its submitter vanished meanwhile)."""
    FAILED = "failed"
    """sbatch refused the job; its message is kept in the submission record."""
    IN_DOUBT = "in_doubt"
    """sbatch did not answer in time: the job may exist under the token."""
    SUBMITTED = "submitted"
    """A job id and a worker record exist; no node has joined a head yet."""
    JOINED = "joined"
    """Its nodes joined the head's Ray cluster; their Ray node ids are recorded."""
    DRAINING = "draining"
    """A drain deadline is persisted: Ray drains the nodes, the job ends when all left."""
    RELEASED = "released"
    """The allocation left the session (drained, ended, cancelled or released itself)."""
    UNRECOGNIZED = "unrecognized"
    """A status this library does not know (a newer one wrote it): never acted upon."""


W = WorkerState
WORKER_TRANSITIONS: tuple[Edge[WorkerState], ...] = (
    Edge(W.ABSENT, "submit_worker", W.SUBMITTING,
         "a worker allocation is added: its token is recorded under the lock, then sbatch runs"),
    Edge(W.SUBMITTING, "worker_submitted", W.SUBMITTED,
         "sbatch printed a job id: the worker record appears with it (agent's submit)"),
    Edge(W.SUBMITTING, "worker_submit_failed", W.FAILED,
         "sbatch refused the job; its message is kept in the submission record"),
    Edge(W.SUBMITTING, "worker_submit_in_doubt", W.IN_DOUBT,
         "sbatch did not answer in time; the job may exist under the token"),
    Edge(W.SUBMITTING, "settle_worker_found", W.SUBMITTED,
         "the submitter vanished, but squeue lists a job carrying its token"),
    Edge(W.IN_DOUBT, "settle_worker_found", W.SUBMITTED,
         "sbatch did not answer, but squeue lists a job carrying the token"),
    Edge(W.FAILED, "settle_worker_found", W.SUBMITTED,
         "sbatch reported a failure, yet squeue lists a job carrying the token"),
    Edge(W.SUBMITTING, "settle_worker_lost", W.FAILED,
         "the submitter vanished and squeue lists no job carrying its token"),
    Edge(W.IN_DOUBT, "settle_worker_lost", W.FAILED,
         "sbatch did not answer and squeue lists no job carrying the token"),
    Edge(W.SUBMITTED, "record_worker_joined", W.JOINED,
         "every node of the allocation joined the head; nodes and Ray node ids recorded"),
    Edge(W.JOINED, "record_worker_joined", W.JOINED,
         "the nodes joined a new head: the new Ray node ids replace the old ones"),
    Edge(W.SUBMITTED, "request_worker_drain", W.DRAINING,
         "removal of an allocation that has not joined yet: the deadline is persisted"),
    Edge(W.JOINED, "request_worker_drain", W.DRAINING,
         "removal (or the pre-walltime signal): the deadline is persisted before Ray drains"),
    Edge(W.SUBMITTED, "assign_worker_intent", W.SUBMITTED,
         "the application moves the allocation into an intent, or out of every intent"),
    Edge(W.JOINED, "assign_worker_intent", W.JOINED,
         "the application moves the allocation into an intent, or out of every intent"),
    Edge(W.SUBMITTED, "release_worker", W.RELEASED,
         "the job ended or was cancelled before its nodes joined a head"),
    Edge(W.JOINED, "release_worker", W.RELEASED,
         "the job ended, or it released itself after rejoin_timeout without a head"),
    Edge(W.DRAINING, "release_worker", W.RELEASED,
         "every node left after the drain (or the deadline passed) and the job ended"),
)

WORKER_TABLE: Mapping[tuple[WorkerState, str], WorkerState] = {
    (edge.source, edge.name): edge.target for edge in WORKER_TRANSITIONS
}
"""``(state, transition) -> state``: the edges of :data:`WORKER_TRANSITIONS` as a lookup."""

SUBMISSIONS = "/worker_submissions"
WORKERS = "/workers"
_SUBMISSION_STATES = {"submitting": W.SUBMITTING, "failed": W.FAILED, "unknown": W.IN_DOUBT}


def worker_state(doc: SessionDocument | None, *, token: str | None = None,
                 job_id: str | None = None) -> WorkerState:
    """The state of the worker allocation with ``job_id`` (its worker record) or, without
    one, of the submission under ``token`` (followed to its worker record once submitted)."""
    if doc is None:
        return W.ABSENT
    if job_id is not None and job_id in doc.workers:
        return _record_state(doc.workers[job_id])
    submission = doc.worker_submissions.get(token) if token is not None else None
    if submission is None:
        return W.ABSENT
    if submission.status == "submitted":
        record = doc.workers.get(submission.job_id or "")
        return _record_state(record) if record is not None else W.UNRECOGNIZED
    return _SUBMISSION_STATES.get(submission.status, W.UNRECOGNIZED)


def _record_state(record: Worker) -> WorkerState:
    if record.released:
        return W.RELEASED
    if record.drain_deadline is not None:
        return W.DRAINING
    return W.JOINED if record.ray_node_ids else W.SUBMITTED


def worker_allowed(state: WorkerState, name: str) -> WorkerState | None:
    """The state ``name`` leads to from ``state`` (None: not an edge of the table)."""
    return WORKER_TABLE.get((state, name))


def _edge(name: str, state: WorkerState, which: str) -> Refused | None:
    return check_edge(WORKER_TRANSITIONS, state, name, f"the worker allocation {which}")


def _unread(name: str) -> Refused:
    return Refused(name, "the session document was not read; read it and retry")


# -- records written by the agent's submit operation ---------------------------------------------
def worker_submission_record(config: Mapping[str, Any], shape: Mapping[str, Any],
                             intent: str | None = None,
                             reconciled: bool = False) -> dict[str, Any]:
    """The fields the session adds to a worker's submission record (``record_value`` of
    the agent's submit operation; the agent adds ``token``, ``status``, ``submitted_at``):
    the resolved configuration and the sbatch options it is submitted with; ``reconciled``
    when ``reconcile_workers`` submits it for ``intent``."""
    record = {"kind": "worker", "intent": intent, "shape": dict(shape), "config": dict(config)}
    if reconciled:
        record["reconciled"] = True
    return record


def worker_record_value(config: Mapping[str, Any], intent: str | None = None,
                        reconciled: bool = False) -> dict[str, Any]:
    """The worker record's fields (the ``on_submitted`` value of the agent's submit
    operation; the agent adds ``job_id``, ``token`` and ``submitted_at``)."""
    record = {"role": "worker", "intent": intent, "config": dict(config), "released": False,
              "nodes": [], "ray_node_ids": {}}
    if reconciled:
        record["reconciled"] = True
    return record


def _submission(token: str) -> str:
    return make_pointer("worker_submissions", token)


def _worker(job_id: str, *field: str) -> str:
    return make_pointer("workers", job_id, *field)


def submit_worker(doc: SessionDocument | None, *, token: str, config: Mapping[str, Any],
                  shape: Mapping[str, Any], intent: str | None = None,
                  job_name: str = "") -> Outcome:
    """ABSENT -> SUBMITTING: record ``token`` before sbatch runs. Refused when the session
    is closed or the token is recorded already."""
    name = "submit_worker"
    if doc is not None and doc.closed:
        return Refused(name, closed_message(doc, job_name))
    refused = _edge(name, worker_state(doc, token=token), f"with token {token!r}")
    if refused is not None:
        return refused
    value = dict(worker_submission_record(config, shape, intent), token=token,
                 status="submitting")
    pointer = _submission(token)
    return Change(name, (
        *SUBMIT_GUARDS,
        setdefault(SUBMISSIONS, {}),
        absent(pointer),
        add(pointer, value),
        add_now(f"{pointer}/submitted_at"),
    ))


def _settled(doc: SessionDocument, name: str, token: str, job_id: str,
             statuses: tuple[str, ...]) -> Outcome:
    """The submission of ``token`` becomes ``submitted`` with ``job_id`` and the worker
    record appears, when its status (as read) is one of ``statuses``."""
    submission = doc.worker_submissions[token]
    if submission.status not in statuses:
        return Refused(name, f"the submission {token!r} is {submission.status}")
    if job_id in doc.workers:
        return Refused(name, f"job {job_id} already has a worker record")
    pointer = _submission(token)
    reconciled = bool((submission.model_extra or {}).get("reconciled"))
    record = dict(worker_record_value(submission.config, submission.intent, reconciled),
                  job_id=job_id, token=token, submitted_at=submission.submitted_at)
    return Change(name, (
        equals(f"{pointer}/status", submission.status),
        absent(_worker(job_id)),
        add(f"{pointer}/status", "submitted"),
        add(f"{pointer}/job_id", job_id),
        setdefault(WORKERS, {}),
        add(_worker(job_id), record),
    ))


def worker_submitted(doc: SessionDocument | None, *, token: str, job_id: str,
                     rc: int | None = 0) -> Outcome:
    """SUBMITTING -> SUBMITTED: sbatch answered ``job_id`` for ``token``; the worker record
    appears in the same change."""
    name = "worker_submitted"
    if doc is None:
        return _unread(name)
    refused = _edge(name, worker_state(doc, token=token), f"with token {token!r}")
    if refused is not None:
        return refused
    change = _settled(doc, name, token, job_id, ("submitting",))
    if isinstance(change, Refused):
        return change
    pointer = _submission(token)
    return Change(name, (
        *change.patch,
        add(f"{pointer}/rc", rc),
        add_now(f"{pointer}/finished_at"),
    ))


def worker_submit_failed(doc: SessionDocument | None, *, token: str, error: str,
                         rc: int | None = None, in_doubt: bool = False) -> Outcome:
    """SUBMITTING -> FAILED (sbatch refused) or IN_DOUBT (sbatch did not answer)."""
    name = "worker_submit_in_doubt" if in_doubt else "worker_submit_failed"
    if doc is None:
        return _unread(name)
    refused = _edge(name, worker_state(doc, token=token), f"with token {token!r}")
    if refused is not None:
        return refused
    return Change(name, sbatch_failed_ops(_submission(token), None, error, rc, in_doubt))


def settle_worker_found(doc: SessionDocument | None, *, token: str, job_id: str) -> Outcome:
    """SUBMITTING, IN_DOUBT or FAILED -> SUBMITTED: squeue lists job ``job_id`` carrying
    ``token`` (its submitter vanished, or sbatch's answer was wrong)."""
    name = "settle_worker_found"
    if doc is None:
        return _unread(name)
    refused = _edge(name, worker_state(doc, token=token), f"with token {token!r}")
    if refused is not None:
        return refused
    return _settled(doc, name, token, job_id, ("submitting", "unknown", "failed"))


def settle_worker_lost(doc: SessionDocument | None, *, token: str) -> Outcome:
    """SUBMITTING or IN_DOUBT -> FAILED: a certain squeue lists no job carrying ``token``
    (its submitter vanished, or sbatch did not answer), so no allocation came of it."""
    name = "settle_worker_lost"
    if doc is None:
        return _unread(name)
    refused = _edge(name, worker_state(doc, token=token), f"with token {token!r}")
    if refused is not None:
        return refused
    pointer = _submission(token)
    status = doc.worker_submissions[token].status
    return Change(name, (
        equals(f"{pointer}/status", status),
        add(f"{pointer}/status", "failed"),
        add(f"{pointer}/error", "no job carrying the token was found in squeue"),
        add_now(f"{pointer}/finished_at"),
    ))


# -- the worker record -------------------------------------------------------------------------
def _as_read(doc: SessionDocument, job_id: str, field: str) -> Op:
    """A guard that ``field`` of the worker record is as read: equal, or still absent."""
    raw = doc.model_dump(mode="json", exclude_unset=True)["workers"][job_id]
    return as_read(_worker(job_id, field), raw.get(field))


def _live(doc: SessionDocument, job_id: str) -> Patch:
    """Guards: the worker record of ``job_id`` exists, is not released and not draining."""
    return (equals(_worker(job_id, "job_id"), job_id),
            _as_read(doc, job_id, "released"),
            absent(_worker(job_id, "drain_deadline")))


def _worker_edge(doc: SessionDocument | None, name: str, job_id: str) -> Refused | None:
    if doc is None:
        return _unread(name)
    if job_id not in doc.workers:
        return Refused(name, f"the session has no worker allocation with job id {job_id!r}")
    return _edge(name, worker_state(doc, job_id=job_id), f"job {job_id}")


def record_worker_joined(doc: SessionDocument | None, *, job_id: str, nodes: list[str],
                         ray_node_ids: Mapping[str, str]) -> Outcome:
    """SUBMITTED/JOINED -> JOINED: the allocation's ``nodes`` joined the head, as the Ray
    nodes ``ray_node_ids`` (Slurm node name -> Ray node id). Guarded by the ids as read, so
    a join recorded meanwhile (a newer head's) is never overwritten by an older one."""
    name = "record_worker_joined"
    refused = _worker_edge(doc, name, job_id)
    if refused is not None:
        return refused
    assert doc is not None
    if not ray_node_ids:
        return Refused(name, "no Ray node id given: record a join once the nodes joined")
    return Change(name, (
        *_live(doc, job_id),
        _as_read(doc, job_id, "ray_node_ids"),
        add(_worker(job_id, "nodes"), list(nodes)),
        add(_worker(job_id, "ray_node_ids"), dict(ray_node_ids)),
    ))


def request_worker_drain(doc: SessionDocument | None, *, job_id: str,
                         drain_timeout: float = 0.0, deadline: float | None = None,
                         intent: str | None = None) -> Outcome:
    """SUBMITTED/JOINED -> DRAINING: persist the drain deadline, ``drain_timeout`` seconds
    from the store's clock (or the absolute ``deadline``, login node epoch seconds), before
    the drain starts. With ``intent`` the record must still belong to that intent. Refused
    when a drain was requested already (its deadline holds: the caller waits for it)."""
    name = "request_worker_drain"
    if not drain_timeout >= 0:
        raise ValueError(f"drain_timeout={drain_timeout!r}: must be 0 or more seconds")
    refused = _worker_edge(doc, name, job_id)
    if refused is not None:
        record = doc.workers.get(job_id) if doc is not None else None
        if record is not None and record.drain_deadline is not None and not record.released:
            return Refused(name, f"job {job_id} is draining already, until "
                                 f"{record.drain_deadline:.0f} (epoch seconds); wait for it")
        return refused
    assert doc is not None
    owned = () if intent is None else (equals(_worker(job_id, "intent"), intent),)
    pointer = _worker(job_id, "drain_deadline")
    if deadline is None:
        persisted = add_now(pointer, drain_timeout)
    else:
        persisted = add(pointer, float(deadline))
    return Change(name, (*_live(doc, job_id), *owned, persisted))


def release_worker(doc: SessionDocument | None, *, job_id: str,
                   final_state: str | None = None) -> Outcome:
    """SUBMITTED/JOINED/DRAINING -> RELEASED: the allocation left the session, in the
    scheduler state ``final_state`` (None: not known, e.g. cancelled at teardown). Refused
    once released (a second release changes nothing)."""
    name = "release_worker"
    refused = _worker_edge(doc, name, job_id)
    if refused is not None:
        return refused
    assert doc is not None
    known = () if final_state is None else (add(_worker(job_id, "final_state"), final_state),)
    return Change(name, (
        equals(_worker(job_id, "job_id"), job_id),
        _as_read(doc, job_id, "released"),
        add(_worker(job_id, "released"), True),
        add_now(_worker(job_id, "released_at")),
        *known,
    ))


def release_live_workers(doc: SessionDocument | None,
                         final_state: str | None = None) -> Change | None:
    """:func:`release_worker` for every live worker allocation of ``doc`` at once, in one
    change (teardown and orphan reconciliation, which cancelled them by the session's job
    name). None when there is none (or ``doc`` is None)."""
    patch: list[Op] = []
    for job_id in sorted(live_workers(doc)):
        decided = release_worker(doc, job_id=job_id, final_state=final_state)
        if isinstance(decided, Change):
            patch.extend(decided.patch)
    return Change("release_worker", tuple(patch)) if patch else None


def live_workers(doc: SessionDocument | None) -> dict[str, Worker]:
    """The worker records of ``doc`` that are not released, by job id."""
    if doc is None:
        return {}
    return {job_id: record for job_id, record in doc.workers.items() if not record.released}


def assign_worker_intent(doc: SessionDocument | None, *, job_id: str,
                         intent: str | None) -> Outcome:
    """SUBMITTED/JOINED -> same: move the live worker allocation ``job_id`` into ``intent``
    (None: out of every intent). Refused for a released allocation and for one being
    released (it keeps its intent until it ends). The record's ``reconciled`` mark is
    cleared: an allocation that joins an intent has no submission time for
    ``pending_timeout``."""
    name = "assign_worker_intent"
    if doc is None:
        return _unread(name)
    record = doc.workers.get(job_id)
    if record is None:
        return Refused(name, f"the session has no worker allocation with job id {job_id!r}")
    if record.released:
        return Refused(name, f"worker allocation {job_id} was released from the session")
    if record.drain_deadline is not None:
        return Refused(name, f"worker allocation {job_id} is being released (its drain "
                             f"deadline is {record.drain_deadline:.0f}); it keeps its intent "
                             f"{record.intent!r} until it ends")
    return Change(name, (
        *_live(doc, job_id),
        _as_read(doc, job_id, "intent"),
        add(_worker(job_id, "intent"), intent),
        add(_worker(job_id, "reconciled"), False),
    ))
