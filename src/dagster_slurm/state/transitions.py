"""Every change to the session document, as named pure transitions over one table.

A transition is a function ``(doc, inputs) -> Change | Refused``. It reads the typed
:class:`~dagster_slurm.state.schema.SessionDocument` (or None when the caller did not read it,
see below), decides, and returns either a :class:`Change` — the patch to apply under the
session lock — or a :class:`Refused` saying, in words a user can act on, why not. It never
does I/O: the session applies the change with ``store.transact(change.patch)`` (one round
trip, possibly batched with other operations).

Guards: every patch starts with the ``test`` operations its decision relied on (the
allocation's job id or token, the record's absence). The document may have changed between
the unlocked read and the locked write; a guard then fails and the store reports a conflict
(``TxnResult.ok`` False) without changing anything. So applying a change is always safe, and
a caller that did not read the document (``doc=None``: the step launch and the drain record,
which must stay one round trip) gets the same check, made under the lock.

This module and :mod:`dagster_slurm.state.successor_transitions` (the successor's
transitions, listed in the same table) are the only places that decide patches of the head
and successor records; :mod:`dagster_slurm.state.election_transitions` adds the head edge
``install_elected_head`` (a worker allocation becomes the head), and
:mod:`dagster_slurm.state.worker_transitions` writes the worker records. All of them build
their operations, guards and checks with :mod:`dagster_slurm.state.patches`. The agent's
``submit`` operation writes the head's submission record itself (it must happen under the
lock right before sbatch); :func:`submit_head` returns the same patch, and
:func:`head_submission_record` the value the session passes to that operation, so the fakes
used in unit tests and the agent agree (a unit test compares them).

The head allocation's states (:class:`HeadState`) and the edges between them::

    ABSENT -> SUBMITTING -> SUBMITTED -> READY -> DRAINING
                  |   \\                   ...every state but ABSENT -> ABSENT (retire)
                  v    \\-> FAILED / IN_DOUBT

:data:`TRANSITIONS` lists every edge with the reason it exists. Session-wide transitions
(``beat``, ``close_session``) leave the head's state as it is; ``submit_head`` is refused once
the session is closed.

The successor (``/successor``, a queued allocation that will replace the head) has its own
record, written like the head's by the agent's ``submit`` operation (``submit_successor``,
then ``successor_submitted`` or ``successor_submit_failed``), moved to the history when it
ends before promotion (``retire_successor``) and moved to ``/allocation`` by
``promote_successor``, which moves the predecessor to the history with the final state
``REPLACED``. These edges leave the head's state as it is, except ``promote_successor``
(the promoted successor is READY).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

# Change, Refused, Outcome, Edge, HEAD and SUBMIT_GUARDS are defined in the patch builder;
# the session also reaches them as ``transitions.<name>``.
from dagster_slurm.state.patches import (
    ANY,
    HEAD,
    SUBMIT_GUARDS,
    Change,
    Edge,
    Outcome,
    Refused,
    absent,
    add,
    add_now,
    check_edge,
    check_owned,
    equals,
    history_entry,
    remove,
    sbatch_answered_ops,
    sbatch_failed_ops,
    submitted_guards,
    submitting_guards,
    to_history,
)
from dagster_slurm.state.schema import Allocation, SessionDocument


class HeadState(str, Enum):
    """The state of the session's head allocation record (``/allocation``)."""

    ABSENT = "absent"
    """No head record: the next step submits one."""
    SUBMITTING = "submitting"
    """A process recorded its token and is running sbatch (or vanished while doing so)."""
    SUBMITTED = "submitted"
    """sbatch answered with a job id; the step server has not reported ready yet."""
    READY = "ready"
    """The step server accepts steps; nodes and the Ray address are recorded."""
    DRAINING = "draining"
    """A drain was requested: steps already started get the drain signal, later ones none."""
    FAILED = "failed"
    """sbatch refused the job; the record fails steps for a while, then is retired."""
    IN_DOUBT = "in_doubt"
    """sbatch did not answer in time (the agent's status ``unknown``): the job may exist."""
    UNRECOGNIZED = "unrecognized"
    """A status this library does not know (written by a newer one): never acted upon,
    except by ``retire``."""


TRANSITIONS: tuple[Edge[HeadState | str], ...] = (
    Edge(HeadState.ABSENT, "submit_head", HeadState.SUBMITTING,
         "no head yet: the first process records its token under the lock, then runs sbatch"),
    Edge(HeadState.SUBMITTING, "head_submitted", HeadState.SUBMITTED,
         "sbatch printed a job id (written by the agent's submit operation)"),
    Edge(HeadState.SUBMITTING, "head_submit_failed", HeadState.FAILED,
         "sbatch refused the job; its message is kept for the steps that wait"),
    Edge(HeadState.SUBMITTING, "head_submit_in_doubt", HeadState.IN_DOUBT,
         "sbatch did not answer in time; the job may exist under the token"),
    Edge(HeadState.SUBMITTING, "settle_found", HeadState.SUBMITTED,
         "the submitter vanished, but squeue lists a job carrying its token"),
    Edge(HeadState.SUBMITTED, "record_ready", HeadState.READY,
         "the step server wrote its ready file; its nodes and Ray address are recorded"),
    Edge(HeadState.SUBMITTED, "launch_step", HeadState.SUBMITTED,
         "a step is requested while the ready record is missing (it failed to write)"),
    Edge(HeadState.READY, "launch_step", HeadState.READY,
         "a step is requested: only checks that the allocation is still the head"),
    Edge(HeadState.DRAINING, "launch_step", HeadState.DRAINING,
         "a step is requested in a draining allocation: the step server answers it drained"),
    Edge(HeadState.SUBMITTED, "request_drain", HeadState.DRAINING,
         "drain before the ready record was written"),
    Edge(HeadState.READY, "request_drain", HeadState.DRAINING,
         "drain requested: the signal went to the allocation; this records when"),
    Edge(HeadState.DRAINING, "request_drain", HeadState.DRAINING,
         "a repeated drain request moves the recorded time; draining stays permanent"),
    Edge(HeadState.SUBMITTING, "retire", HeadState.ABSENT,
         "the submitter vanished and squeue has no job with its token: history, unknown"),
    Edge(HeadState.SUBMITTED, "retire", HeadState.ABSENT,
         "the allocation ended (or was unschedulable) before it accepted steps: history"),
    Edge(HeadState.READY, "retire", HeadState.ABSENT,
         "the allocation ended after serving steps: history; the next step submits anew"),
    Edge(HeadState.DRAINING, "retire", HeadState.ABSENT,
         "a drained allocation ended: history"),
    Edge(HeadState.FAILED, "retire", HeadState.ABSENT,
         "a refused submission older than the failure window: history; a retry submits"),
    Edge(HeadState.IN_DOUBT, "retire", HeadState.ABSENT,
         "an unanswered submission whose token squeue does not list: history"),
    Edge(HeadState.UNRECOGNIZED, "retire", HeadState.ABSENT,
         "a record of a newer library that ended: history, kept as it was"),
    Edge(HeadState.SUBMITTED, "submit_successor", HeadState.SUBMITTED,
         "a successor is queued behind a head that has not accepted steps yet"),
    Edge(HeadState.READY, "submit_successor", HeadState.READY,
         "a successor is queued while the head runs: its token is recorded at /successor"),
    Edge(HeadState.DRAINING, "submit_successor", HeadState.DRAINING,
         "a successor is queued while the head drains its payloads"),
    Edge(ANY, "successor_submitted", ANY,
         "sbatch printed the successor's job id (written by the agent's submit operation)"),
    Edge(ANY, "successor_submit_failed", ANY,
         "sbatch refused the successor (or did not answer); its message is kept"),
    Edge(ANY, "retire_successor", ANY,
         "a successor that ended, or whose submission failed, before promotion: history"),
    Edge(HeadState.ABSENT, "promote_successor", HeadState.READY,
         "the predecessor ended and was retired: the ready successor becomes the head"),
    Edge(HeadState.SUBMITTED, "promote_successor", HeadState.READY,
         "the ready successor replaces a head that never accepted steps: history, REPLACED"),
    Edge(HeadState.READY, "promote_successor", HeadState.READY,
         "the ready successor replaces the running head: history, REPLACED"),
    Edge(HeadState.DRAINING, "promote_successor", HeadState.READY,
         "the ready successor replaces the drained head: history, REPLACED"),
    Edge(ANY, "beat", ANY,
         "a supervising process is alive: host, pid and the login node's time"),
    Edge(ANY, "close_session", ANY,
         "teardown or orphan reconciliation: no process submits for the session again"),
    Edge(HeadState.ABSENT, "install_elected_head", HeadState.READY,
         "the head ended and was retired: the elected worker allocation hosts the head"),
    Edge(HeadState.SUBMITTED, "install_elected_head", HeadState.READY,
         "the elected worker allocation replaces a head that never accepted steps: REPLACED"),
    Edge(HeadState.READY, "install_elected_head", HeadState.READY,
         "the head's Ray stopped or its job ended: the elected worker hosts it; REPLACED"),
    Edge(HeadState.DRAINING, "install_elected_head", HeadState.READY,
         "the draining head hands over to the elected worker allocation: history, REPLACED"),
    Edge(HeadState.FAILED, "install_elected_head", HeadState.READY,
         "a refused head submission is replaced by the elected worker allocation"),
    Edge(HeadState.IN_DOUBT, "install_elected_head", HeadState.READY,
         "an unanswered head submission is replaced by the elected worker allocation"),
)

TABLE: Mapping[tuple[HeadState | str, str], HeadState | str] = {
    (edge.source, edge.name): edge.target for edge in TRANSITIONS
}
"""``(state, transition) -> state``: the edges of :data:`TRANSITIONS` as a lookup."""

_STATUS = {
    "submitting": HeadState.SUBMITTING,
    "failed": HeadState.FAILED,
    "unknown": HeadState.IN_DOUBT,
}


def document(raw: Mapping[str, Any] | None, job_name: str = "") -> SessionDocument | None:
    """The typed form of a raw document (None when it does not exist yet)."""
    if raw is None:
        return None
    data = dict(raw)
    data.setdefault("job_name", job_name)
    return SessionDocument.from_dict(data)


def head_state(doc: SessionDocument | None) -> HeadState:
    """The state of ``doc``'s head allocation record."""
    record = doc.allocation if doc is not None else None
    if record is None:
        return HeadState.ABSENT
    if record.status == "submitted":
        if not record.job_id:
            return HeadState.UNRECOGNIZED
        if record.drain_requested_at is not None:
            return HeadState.DRAINING
        return HeadState.READY if record.ready_at is not None else HeadState.SUBMITTED
    return _STATUS.get(record.status, HeadState.UNRECOGNIZED)


def allowed(state: HeadState, name: str) -> HeadState | str | None:
    """The state ``name`` leads to from ``state`` (None: not an edge of the table)."""
    target = TABLE.get((state, name))
    if target is None and (ANY, name) in TABLE:
        return state
    return target


def check_head_edge(doc: SessionDocument | None, name: str) -> Refused | None:
    """Refused when :data:`TRANSITIONS` has no edge ``name`` from ``doc``'s head state (None:
    go on). Without a document (the caller did not read it) only the patch's guards
    decide."""
    if doc is None:
        return None
    state = head_state(doc)
    return check_edge(TRANSITIONS, state, name, "the head allocation",
                      describe_head(doc.allocation, state))


def describe_head(record: Allocation | None, state: HeadState) -> str:
    """The head record in the user's words: its state and job id (or token)."""
    if record is None:
        return "absent"
    job = f" (job {record.job_id})" if record.job_id else f" (token {record.token})"
    status = state.value if state is not HeadState.UNRECOGNIZED else f"{record.status!r}"
    return status + job


# -- head allocation ----------------------------------------------------------------------------
def head_submission_record(config: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the session adds to the head's submission record (``record_value`` of the
    agent's submit operation; the agent adds ``token``, ``status`` and ``submitted_at``)."""
    return {"kind": "head", "config": dict(config)}


def submit_head(doc: SessionDocument | None, *, token: str, config: Mapping[str, Any],
                job_name: str = "") -> Outcome:
    """ABSENT -> SUBMITTING: record the token before sbatch runs. Refused when the session
    is closed or already has a head record (the caller then waits for that one)."""
    if doc is not None and doc.closed:
        return Refused("submit_head", closed_message(doc, job_name))
    refused = check_head_edge(doc, "submit_head")
    if refused is not None:
        return refused
    value = dict(head_submission_record(config), token=token, status="submitting")
    return Change("submit_head", (
        *SUBMIT_GUARDS,
        absent(HEAD),
        add(HEAD, value),
        add_now(f"{HEAD}/submitted_at"),
    ))


def closed_message(doc: SessionDocument, job_name: str = "") -> str:
    """Why a closed session submits nothing (shown to the user)."""
    name = job_name or doc.job_name
    reason = f" ({doc.closed_reason})" if doc.closed_reason else ""
    return (f"the run session {name} was closed{reason} (the run's teardown cancelled its "
            "allocation); no new allocation is submitted for it")


def head_submitted(doc: SessionDocument | None, *, token: str, job_id: str,
                   rc: int | None = 0) -> Outcome:
    """SUBMITTING -> SUBMITTED: sbatch answered ``job_id`` for ``token``."""
    name = "head_submitted"
    refused = check_owned(doc, name, "token", token) or check_head_edge(doc, name)
    if refused is not None:
        return refused
    return Change(name, sbatch_answered_ops(HEAD, token, job_id, rc))


def head_submit_failed(doc: SessionDocument | None, *, token: str, error: str,
                       rc: int | None = None, in_doubt: bool = False) -> Outcome:
    """SUBMITTING -> FAILED (sbatch refused) or IN_DOUBT (sbatch did not answer)."""
    name = "head_submit_in_doubt" if in_doubt else "head_submit_failed"
    refused = check_owned(doc, name, "token", token) or check_head_edge(doc, name)
    if refused is not None:
        return refused
    return Change(name, sbatch_failed_ops(HEAD, token, error, rc, in_doubt))


def settle_found(doc: SessionDocument | None, *, token: str, job_id: str) -> Outcome:
    """SUBMITTING -> SUBMITTED: a vanished submitter's job, found by its token in squeue."""
    name = "settle_found"
    refused = check_owned(doc, name, "token", token) or check_head_edge(doc, name)
    if refused is not None:
        return refused
    return Change(name, (
        *submitting_guards(HEAD, token),
        add(f"{HEAD}/status", "submitted"),
        add(f"{HEAD}/job_id", job_id),
    ))


def record_ready(doc: SessionDocument | None, *, job_id: str, nodes: Sequence[str],
                 ray_address: str | None) -> Outcome:
    """SUBMITTED -> READY: the step server accepts steps on ``nodes`` (head first)."""
    name = "record_ready"
    refused = check_owned(doc, name, "job_id", job_id) or check_head_edge(doc, name)
    if refused is not None:
        return refused
    return Change(name, (
        *submitted_guards(job_id),
        absent(f"{HEAD}/ready_at"),
        absent(f"{HEAD}/drain_requested_at"),
        add(f"{HEAD}/nodes", list(nodes)),
        add(f"{HEAD}/ray_address", ray_address),
        add_now(f"{HEAD}/ready_at"),
    ))


def launch_step(doc: SessionDocument | None, *, job_id: str) -> Outcome:
    """A step is requested in ``job_id``: the guard that it is still the head (no write)."""
    name = "launch_step"
    refused = check_owned(doc, name, "job_id", job_id) or check_head_edge(doc, name)
    if refused is not None:
        return refused
    return Change(name, submitted_guards(job_id))


def request_drain(doc: SessionDocument | None, *, job_id: str) -> Outcome:
    """SUBMITTED/READY/DRAINING -> DRAINING: record when the drain was requested."""
    name = "request_drain"
    refused = check_owned(doc, name, "job_id", job_id) or check_head_edge(doc, name)
    if refused is not None:
        return refused
    return Change(name, (*submitted_guards(job_id), add_now(f"{HEAD}/drain_requested_at")))


def retire(doc: SessionDocument | None, *, key: str, value: str,
           final_state: str | None) -> Outcome:
    """Any state but ABSENT -> ABSENT: move the head record whose ``key`` (``job_id`` or
    ``token``) is ``value`` to ``/history/<job id or token>`` with ``final_state`` and
    ``ended_at``. Needs the document (the record is copied)."""
    if key not in ("job_id", "token"):
        raise ValueError(f"retire by {key!r}: use 'job_id' or 'token'")
    if doc is None:
        return Refused("retire", "the session document was not read; read it and retry")
    refused = check_owned(doc, "retire", key, value) or check_head_edge(doc, "retire")
    if refused is not None:
        return refused
    raw, name, entry = history_entry(doc, HEAD, final_state)
    return Change("retire", (
        # the record as read, exactly: a record changed meanwhile is re-read, not lost
        equals(HEAD, raw),
        *to_history(name, entry),
        remove(HEAD),
    ))


# -- session-wide ------------------------------------------------------------------------------
def beat(doc: SessionDocument | None, *, host: str, pid: int) -> Outcome:
    """Any state: ``/heartbeat`` = this process, at the login node's time."""
    return Change("beat", (
        add("/heartbeat", {"host": host, "pid": pid, "at": 0}),
        add_now("/heartbeat/at"),
    ))


def close_session(doc: SessionDocument | None, *, reason: str) -> Outcome:
    """Any state: the session is closed (its jobs were cancelled by job name)."""
    return Change("close_session", (
        add_now("/closed_at"),
        add("/closed_reason", reason),
    ))
