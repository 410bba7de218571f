"""The successor's transitions: queue, record, retire and promote a successor allocation.

Part of the one table of :mod:`dagster_slurm.state.transitions` (its ``TRANSITIONS`` lists
these edges too); kept in a module of their own so that each stays small. The same rules
apply: pure functions ``(doc, inputs) -> Change | Refused``, every patch guarded by what its
decision relied on.

The successor record (``/successor``) is written like the head's: the agent's ``submit``
operation records it under the lock right before sbatch (:func:`submit_successor` returns
that patch, :func:`successor_submission_record` and :func:`successor_guards` what the
session passes to the operation), then ``successor_submitted`` or
``successor_submit_failed``. A successor that ends before promotion is moved to the history
(:func:`retire_successor`); :func:`promote_successor` moves it to ``/allocation`` and the
predecessor to the history with the final state ``REPLACED``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster_slurm.agent.remote.patch import make_pointer
from dagster_slurm.state.schema import Allocation, SessionDocument
from dagster_slurm.state.transitions import (
    HEAD,
    SUBMIT_GUARDS,
    Change,
    Outcome,
    Patch,
    Refused,
    _describe,
    _edge,
    _owns,
    _submitted,
    closed_message,
    head_state,
    sbatch_answered_ops,
    sbatch_failed_ops,
)

SUCCESSOR = "/successor"

#: ``final_state`` of a head record replaced by a promoted successor.
REPLACED_STATE = "REPLACED"


def successor_submission_record(config: Mapping[str, Any], predecessor: str) -> dict[str, Any]:
    """The fields the session adds to the successor's submission record (``record_value``
    of the agent's submit operation): its configuration and the head it was queued behind."""
    return {"kind": "successor", "config": dict(config), "predecessor": predecessor}


def successor_guards(predecessor: str) -> Patch:
    """What must hold when the successor's token is recorded: the session is open and its
    head is still job ``predecessor`` (the agent's submit operation checks it under the
    lock; it adds the absence of ``/successor`` itself)."""
    return (*SUBMIT_GUARDS, *_submitted(predecessor))


def submit_successor(doc: SessionDocument | None, *, token: str, config: Mapping[str, Any],
                     predecessor: str, job_name: str = "") -> Outcome:
    """Record the successor's token before sbatch runs (the head keeps its state). Refused
    when the session is closed, a successor is outstanding, or the head is not job
    ``predecessor`` (SUBMITTED, READY or DRAINING)."""
    name = "submit_successor"
    if doc is not None and doc.closed:
        return Refused(name, closed_message(doc, job_name))
    if doc is not None and doc.successor is not None:
        return Refused(name, outstanding_message(doc.successor))
    refused = _owns(doc, name, "job_id", predecessor) or _edge(doc, name)
    if refused is not None:
        return refused
    value = dict(successor_submission_record(config, predecessor), token=token,
                 status="submitting")
    return Change(name, (
        *successor_guards(predecessor),
        {"op": "absent", "path": SUCCESSOR},
        {"op": "add", "path": SUCCESSOR, "value": value},
        {"op": "add", "path": f"{SUCCESSOR}/submitted_at", "value_now": 0},
    ))


def outstanding_message(record: Allocation) -> str:
    """Why a second successor is not submitted (names the outstanding one)."""
    which = f"job {record.job_id}" if record.job_id else f"token {record.token}"
    return (f"the session already has an outstanding successor ({which}, status "
            f"{record.status}); promote it with promote_successor() (or let it end) before "
            "submitting another")


def _successor_is(doc: SessionDocument | None, name: str, key: str,
                  value: str) -> Refused | None:
    if doc is None:
        return None
    record = doc.successor
    if record is None or getattr(record, key) != value:
        current = "absent" if record is None else f"{key} {getattr(record, key)!r}"
        return Refused(name, f"the successor is no longer the one with {key} {value!r} "
                             f"(now {current})")
    return None


def successor_submitted(doc: SessionDocument | None, *, token: str, job_id: str,
                        rc: int | None = 0) -> Outcome:
    """The successor's sbatch answered ``job_id`` for ``token``."""
    refused = _successor_is(doc, "successor_submitted", "token", token)
    if refused is not None:
        return refused
    return Change("successor_submitted", sbatch_answered_ops(SUCCESSOR, token, job_id, rc))


def successor_submit_failed(doc: SessionDocument | None, *, token: str, error: str,
                            rc: int | None = None, in_doubt: bool = False) -> Outcome:
    """The successor's sbatch refused the job (``failed``) or did not answer (``unknown``)."""
    refused = _successor_is(doc, "successor_submit_failed", "token", token)
    if refused is not None:
        return refused
    return Change("successor_submit_failed",
                  sbatch_failed_ops(SUCCESSOR, token, error, rc, in_doubt))


def _history_entry(doc: SessionDocument, pointer: str, final_state: str | None) -> tuple[
        dict[str, Any], str, dict[str, Any]]:
    """``(raw record as read, history name, history entry)`` of the record at ``pointer``."""
    key = pointer.strip("/")
    raw = doc.model_dump(mode="json", exclude_unset=True)[key]
    record = doc.model_dump(mode="json")[key]
    return raw, str(record.get("job_id") or record.get("token")), dict(
        record, final_state=final_state)


def replace_head_ops(doc: SessionDocument) -> list[Mapping[str, Any]]:
    """Patch operations retiring the head record so that another allocation can take its
    place: the head, unchanged since ``doc`` was read, goes to the history as ``REPLACED``
    (stamped ``ended_at``); without a head record, none may have appeared meanwhile."""
    if doc.allocation is None:
        return [{"op": "absent", "path": HEAD}]
    raw, history_name, entry = _history_entry(doc, HEAD, REPLACED_STATE)
    return [
        {"op": "test", "path": HEAD, "value": raw},
        {"op": "setdefault", "path": "/history", "value": {}},
        {"op": "add", "path": make_pointer("history", history_name), "value": entry},
        {"op": "add", "path": make_pointer("history", history_name, "ended_at"),
         "value_now": 0},
    ]


def retire_successor(doc: SessionDocument | None, *, token: str,
                     final_state: str | None) -> Outcome:
    """Move the successor record of ``token`` (it ended, or its submission failed, before
    promotion) to ``/history`` with ``final_state``. Needs the document."""
    if doc is None:
        return Refused("retire_successor", "the session document was not read; read it and retry")
    refused = _successor_is(doc, "retire_successor", "token", token)
    if refused is not None:
        return refused
    raw, name, entry = _history_entry(doc, SUCCESSOR, final_state)
    return Change("retire_successor", (
        {"op": "test", "path": SUCCESSOR, "value": raw},
        {"op": "setdefault", "path": "/history", "value": {}},
        {"op": "absent", "path": make_pointer("history", name)},
        {"op": "add", "path": make_pointer("history", name), "value": entry},
        {"op": "add", "path": make_pointer("history", name, "ended_at"), "value_now": 0},
        {"op": "remove", "path": SUCCESSOR},
    ))


def promote_successor(doc: SessionDocument | None, *, job_id: str, predecessor: str | None,
                      nodes: Sequence[str], ray_address: str | None) -> Outcome:
    """The successor ``job_id`` (its step server is ready on ``nodes``) becomes the head;
    the head job ``predecessor`` (None: there is none, it ended and was retired) moves to
    ``/history`` with the final state ``REPLACED``. Needs the document: both records are
    guarded exactly as read, so a change of either (a step admitted meanwhile does not write
    the document; the caller checks those) fails the promotion as a conflict."""
    name = "promote_successor"
    if doc is None:
        return Refused(name, "the session document was not read; read it and retry")
    if doc.closed:
        return Refused(name, closed_message(doc))
    refused = _successor_is(doc, name, "job_id", job_id)
    if refused is None and doc.successor is not None and doc.successor.status != "submitted":
        refused = Refused(name, f"the successor's submission is {doc.successor.status}")
    if refused is None and predecessor is None and doc.allocation is not None:
        refused = Refused(name, "the session has a head allocation again "
                                f"({_describe(doc.allocation, head_state(doc))})")
    if refused is None and predecessor is not None:
        refused = _owns(doc, name, "job_id", predecessor)
    refused = refused or _edge(doc, name)
    if refused is not None:
        return refused
    successor_raw, _, _ = _history_entry(doc, SUCCESSOR, None)
    patch: list[Mapping[str, Any]] = [{"op": "test", "path": SUCCESSOR, "value": successor_raw}]
    patch += replace_head_ops(doc)
    head = dict(doc.model_dump(mode="json")["successor"], kind="head", nodes=list(nodes),
                ray_address=ray_address, promoted_from=predecessor)
    head.pop("drain_requested_at", None)
    patch += [
        {"op": "add", "path": HEAD, "value": head},
        {"op": "add", "path": f"{HEAD}/ready_at", "value_now": 0},
        {"op": "remove", "path": SUCCESSOR},
    ]
    return Change(name, tuple(patch))
