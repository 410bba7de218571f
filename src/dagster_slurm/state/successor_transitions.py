"""The successor's transitions: queue, record, retire and promote a successor allocation.

Part of the one table of :mod:`dagster_slurm.state.transitions` (its ``TRANSITIONS`` lists
these edges too); kept in a module of their own so that each stays small. The same rules
apply: pure functions ``(doc, inputs) -> Change | Refused``, every patch guarded by what its
decision relied on, built from :mod:`dagster_slurm.state.patches`.

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

from dagster_slurm.state.patches import (
    HEAD,
    SUBMIT_GUARDS,
    SUCCESSOR,
    Change,
    Op,
    Outcome,
    Patch,
    Refused,
    absent,
    add,
    add_now,
    check_owned,
    equals,
    history_entry,
    remove,
    replace_head_ops,
    sbatch_answered_ops,
    sbatch_failed_ops,
    submitted_guards,
    to_history,
)
from dagster_slurm.state.schema import Allocation, SessionDocument
from dagster_slurm.state.transitions import (
    check_head_edge,
    closed_message,
    describe_head,
    head_state,
)


def successor_submission_record(config: Mapping[str, Any], predecessor: str) -> dict[str, Any]:
    """The fields the session adds to the successor's submission record (``record_value``
    of the agent's submit operation): its configuration and the head it was queued behind."""
    return {"kind": "successor", "config": dict(config), "predecessor": predecessor}


def successor_guards(predecessor: str) -> Patch:
    """What must hold when the successor's token is recorded: the session is open and its
    head is still job ``predecessor`` (the agent's submit operation checks it under the
    lock; it adds the absence of ``/successor`` itself)."""
    return (*SUBMIT_GUARDS, *submitted_guards(predecessor))


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
    refused = check_owned(doc, name, "job_id", predecessor) or check_head_edge(doc, name)
    if refused is not None:
        return refused
    value = dict(successor_submission_record(config, predecessor), token=token,
                 status="submitting")
    return Change(name, (
        *successor_guards(predecessor),
        absent(SUCCESSOR),
        add(SUCCESSOR, value),
        add_now(f"{SUCCESSOR}/submitted_at"),
    ))


def outstanding_message(record: Allocation) -> str:
    """Why a second successor is not submitted (names the outstanding one)."""
    which = f"job {record.job_id}" if record.job_id else f"token {record.token}"
    return (f"the session already has an outstanding successor ({which}, status "
            f"{record.status}); promote it with promote_successor() (or let it end) before "
            "submitting another")


def successor_submitted(doc: SessionDocument | None, *, token: str, job_id: str,
                        rc: int | None = 0) -> Outcome:
    """The successor's sbatch answered ``job_id`` for ``token``."""
    refused = check_owned(doc, "successor_submitted", "token", token, record="successor")
    if refused is not None:
        return refused
    return Change("successor_submitted", sbatch_answered_ops(SUCCESSOR, token, job_id, rc))


def successor_submit_failed(doc: SessionDocument | None, *, token: str, error: str,
                            rc: int | None = None, in_doubt: bool = False) -> Outcome:
    """The successor's sbatch refused the job (``failed``) or did not answer (``unknown``)."""
    refused = check_owned(doc, "successor_submit_failed", "token", token, record="successor")
    if refused is not None:
        return refused
    return Change("successor_submit_failed",
                  sbatch_failed_ops(SUCCESSOR, token, error, rc, in_doubt))


def retire_successor(doc: SessionDocument | None, *, token: str,
                     final_state: str | None) -> Outcome:
    """Move the successor record of ``token`` (it ended, or its submission failed, before
    promotion) to ``/history`` with ``final_state``. Needs the document."""
    if doc is None:
        return Refused("retire_successor", "the session document was not read; read it and retry")
    refused = check_owned(doc, "retire_successor", "token", token, record="successor")
    if refused is not None:
        return refused
    raw, name, entry = history_entry(doc, SUCCESSOR, final_state)
    return Change("retire_successor", (
        equals(SUCCESSOR, raw),
        *to_history(name, entry, exclusive=True),
        remove(SUCCESSOR),
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
    refused = check_owned(doc, name, "job_id", job_id, record="successor")
    if refused is None and doc.successor is not None and doc.successor.status != "submitted":
        refused = Refused(name, f"the successor's submission is {doc.successor.status}")
    if refused is None and predecessor is None and doc.allocation is not None:
        refused = Refused(name, "the session has a head allocation again "
                                f"({describe_head(doc.allocation, head_state(doc))})")
    if refused is None and predecessor is not None:
        refused = check_owned(doc, name, "job_id", predecessor)
    refused = refused or check_head_edge(doc, name)
    if refused is not None:
        return refused
    successor_raw, _, _ = history_entry(doc, SUCCESSOR, None)
    patch: list[Op] = [equals(SUCCESSOR, successor_raw), *replace_head_ops(doc)]
    head = dict(doc.model_dump(mode="json")["successor"], kind="head", nodes=list(nodes),
                ray_address=ray_address, promoted_from=predecessor)
    head.pop("drain_requested_at", None)
    return Change(name, (*patch, add(HEAD, head), add_now(f"{HEAD}/ready_at"), remove(SUCCESSOR)))
