"""Head elections: the claim with a lease that makes one process the elector.

The election record (``/election``) holds the current ``term``, the ``candidate`` chosen by
:func:`~dagster_slurm.state.election.choose_head` (a job id; None for a new allocation),
the elector (``claimed_by``), when it claimed (``started_at``) and until when its claim
holds (``expires_at``, the store's clock), and ``failures``: per job id, how many head
starts failed there. The elector:

1. :func:`claim_election` — takes the claim for the next term, if nobody holds an
   unexpired one: the first caller wins, every other caller is refused (or fails its guard)
   and waits;
2. :func:`renew_election` — while the new head starts (a new allocation may wait in the
   queue), every half lease;
3. :func:`complete_election` once the head runs (for a worker allocation:
   :func:`install_elected_head`, which also makes it the head record), or
   :func:`fail_election` when it did not start, which counts a failure of the candidate
   (an allocation that failed twice is passed over by the next election).

The claim is a lease (:mod:`dagster_slurm.state.lease`) kept in the election record, whose
owner field is ``claimed_by``: it is taken, renewed, checked and expired with the lease
primitives (:func:`~dagster_slurm.state.lease.take_guards`,
:func:`~dagster_slurm.state.lease.holder_guard`,
:func:`~dagster_slurm.state.lease.unexpired_guard`, :func:`~dagster_slurm.state.lease.expiry`,
:func:`~dagster_slurm.state.lease.has_expired`); the record adds the term, the candidate and
the failure counts, and is released rather than removed (its term and counts stay).

Guarantees: at most one unexpired claim (the claim is guarded by the election record
exactly as read and, to take over, by its expiry at the store's clock); an elector that
dies blocks the next election for at most :data:`CLAIM_TTL` seconds after its last
renewal; the taking over of an expired claim counts one failure of its candidate, in the
same change, so a start that killed its elector is not retried first. Completing needs the
unexpired claim, failing only the claim (an expired elector may still report its failure
while nobody took over). Non-guarantee: an elector paused past its lease may still act;
it must check its lease (``expires_at`` against the store's clock, or a local deadline)
before each step, as with :mod:`dagster_slurm.state.lease`.

Claim states (:class:`ClaimState`, derived at a given time by :func:`claim_state`)::

    FREE --claim_election--> CLAIMED --complete_election / fail_election--> FREE
                                |  ^ renew_election
                    (lease passes)  |
                                v  |
                             EXPIRED --claim_election (takeover)--> CLAIMED
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from dagster_slurm.agent.remote.patch import make_pointer
from dagster_slurm.state import lease
from dagster_slurm.state.patches import (
    HEAD,
    Change,
    Edge,
    Op,
    Outcome,
    Patch,
    Refused,
    add,
    add_now,
    check_edge,
    equals,
    incr,
    replace_head_ops,
    setdefault,
)
from dagster_slurm.state.schema import Election, SessionDocument
from dagster_slurm.state.transitions import check_head_edge, closed_message

ELECTION = "/election"

CLAIM_TTL = 120.0
"""Seconds an election claim holds without renewal: how long a dead elector blocks the
next election."""

FAILED_TWICE = 2
"""Failed head starts after which an allocation is passed over by elections."""


class ClaimState(str, Enum):
    """The state of the election claim at a given time."""

    FREE = "free"
    """No election runs: no record, or its claim was completed or failed."""
    CLAIMED = "claimed"
    """An elector holds an unexpired claim; everyone else waits."""
    EXPIRED = "expired"
    """The elector's claim expired (it died or stalled): the next elector may take over."""


C = ClaimState
ELECTION_TRANSITIONS: tuple[Edge[ClaimState], ...] = (
    Edge(C.FREE, "claim_election", C.CLAIMED,
         "the head is gone or draining: the first caller claims the next term with a lease"),
    Edge(C.EXPIRED, "claim_election", C.CLAIMED,
         "the elector died or stalled: take over, counting a failure of its candidate"),
    Edge(C.CLAIMED, "renew_election", C.CLAIMED,
         "the elector still starts the head (a new allocation may queue): lease extended"),
    Edge(C.CLAIMED, "complete_election", C.FREE,
         "the new head runs: the claim is released, the waiting callers read the head"),
    Edge(C.CLAIMED, "install_elected_head", C.FREE,
         "the control plane runs on the elected worker allocation: it becomes the head"),
    Edge(C.CLAIMED, "fail_election", C.FREE,
         "the head did not start on the candidate: one failure counted, claim released"),
    Edge(C.EXPIRED, "fail_election", C.FREE,
         "an elector past its lease reports the failure while nobody took over"),
)

ELECTION_TABLE: Mapping[tuple[ClaimState, str], ClaimState] = {
    (edge.source, edge.name): edge.target for edge in ELECTION_TRANSITIONS
}
"""``(state, transition) -> state``: the edges of :data:`ELECTION_TRANSITIONS`."""


def claim_state(doc: SessionDocument | None, now: float) -> ClaimState:
    """The claim's state at ``now`` (the store's clock): ``expires_at == now`` counts as
    expired, as for leases; a claim without an expiry counts as expired."""
    election = doc.election if doc is not None else None
    if election is None or election.claimed_by is None:
        return C.FREE
    return C.EXPIRED if lease.has_expired(election.expires_at, now) else C.CLAIMED


def failures(doc: SessionDocument | None, job_id: str) -> int:
    """How many head starts failed on allocation ``job_id``."""
    election = doc.election if doc is not None else None
    return 0 if election is None else int(election.failures.get(job_id, 0))


def _edge(doc: SessionDocument | None, name: str, now: float) -> Refused | None:
    state = claim_state(doc, now)
    election = doc.election if doc is not None else None
    where = None
    if state is C.CLAIMED and election is not None:
        where = (f"claimed by {election.claimed_by} for term {election.term} until "
                 f"{election.expires_at:.0f} (epoch seconds)")
    return check_edge(ELECTION_TRANSITIONS, state, name, "the election", where)


def _raw(doc: SessionDocument) -> dict[str, Any]:
    return doc.model_dump(mode="json", exclude_unset=True)["election"]


def claim_election(doc: SessionDocument | None, *, owner: str, candidate: str | None,
                   now: float, ttl: float = CLAIM_TTL) -> Outcome:
    """FREE/EXPIRED -> CLAIMED: ``owner`` claims the next term to make ``candidate`` (a
    job id; None: a new allocation) the head, until ``ttl`` seconds from the store's
    clock. ``now`` is the time of the read ``doc`` came with (the store's clock); taking
    over an expired claim is guarded by its expiry at commit time as well."""
    name = "claim_election"
    if doc is None:
        return Refused(name, "the session document was not read; read it and retry")
    if doc.closed:
        return Refused(name, closed_message(doc))
    if not ttl > 0:
        raise ValueError(f"ttl={ttl!r}: must be a positive number of seconds")
    refused = _edge(doc, name, now)
    if refused is not None:
        return refused
    election = doc.election
    takeover = claim_state(doc, now) is C.EXPIRED
    term, counts = 1, {}
    if election is not None:
        term, counts = election.term + 1, dict(election.failures)
        if takeover and election.candidate is not None:
            counts[election.candidate] = counts.get(election.candidate, 0) + 1
    guards = lease.take_guards(ELECTION, None if election is None else _raw(doc),
                               takeover=takeover)
    value = Election(term=term, candidate=candidate, claimed_by=owner,
                     failures=counts).model_dump(mode="json")
    return Change(name, (
        *guards,
        add(ELECTION, value),
        add_now(f"{ELECTION}/started_at"),
        lease.expiry(ELECTION, ttl),
    ))


def _holds(owner: str, term: int) -> Patch:
    """Guards: ``owner`` holds the claim of ``term`` (expired or not)."""
    return (lease.holder_guard(ELECTION, owner, "claimed_by"),
            equals(f"{ELECTION}/term", term))


def _owned(doc: SessionDocument | None, name: str, owner: str, term: int,
           now: float) -> Refused | None:
    if doc is None:
        return Refused(name, "the session document was not read; read it and retry")
    election = doc.election
    if election is None or election.claimed_by != owner or election.term != term:
        held = ("no election" if election is None else
                f"term {election.term} claimed by {election.claimed_by}")
        return Refused(name, f"{owner} does not hold the claim of term {term} (now {held}): "
                             "another elector took over; read the head it elects")
    return _edge(doc, name, now)


def renew_election(doc: SessionDocument | None, *, owner: str, term: int, now: float,
                   ttl: float = CLAIM_TTL) -> Outcome:
    """CLAIMED -> CLAIMED: ``owner`` still elects for ``term``: the claim holds until
    ``ttl`` seconds from the store's clock. Refused (or a conflict) once it expired."""
    name = "renew_election"
    refused = _owned(doc, name, owner, term, now)
    if refused is not None:
        return refused
    return Change(name, (*_holds(owner, term), lease.unexpired_guard(ELECTION),
                         lease.expiry(ELECTION, ttl)))


def _release() -> Patch:
    """The claim is released: no holder, no expiry (the term and counts stay)."""
    return (add(f"{ELECTION}/claimed_by", None), add(f"{ELECTION}/expires_at", None))


def complete_election(doc: SessionDocument | None, *, owner: str, term: int,
                      now: float) -> Outcome:
    """CLAIMED -> FREE: the head of ``owner``'s term runs; the claim is released (the
    candidate stays recorded as the term's head). Needs the unexpired claim."""
    name = "complete_election"
    refused = _owned(doc, name, owner, term, now)
    if refused is not None:
        return refused
    return Change(name, (*_holds(owner, term), lease.unexpired_guard(ELECTION), *_release()))


def fail_election(doc: SessionDocument | None, *, owner: str, term: int,
                  now: float) -> Outcome:
    """CLAIMED/EXPIRED -> FREE: the head did not start on the term's candidate; one
    failure is counted for it (none for a new allocation) and the claim is released."""
    name = "fail_election"
    refused = _owned(doc, name, owner, term, now)
    if refused is not None:
        return refused
    assert doc is not None and doc.election is not None
    candidate = doc.election.candidate
    count: Patch = ()
    if candidate is not None:
        count = (setdefault(f"{ELECTION}/failures", {}),
                 incr(make_pointer("election", "failures", candidate), 1))
    return Change(name, (*_holds(owner, term), *count, *_release()))


#: ``kind`` of a head record whose job is a worker allocation hosting the control plane:
#: when the head moves on, that job stays (a worker), it is never cancelled as a predecessor.
WORKER_HEAD_KIND = "worker"


def install_elected_head(doc: SessionDocument | None, *, owner: str, term: int, job_id: str,
                         nodes: list[str], ray_address: str | None, now: float) -> Outcome:
    """The elected worker allocation ``job_id`` hosts the head (its control plane answers
    on ``nodes[0]`` at ``ray_address``): ``/allocation`` becomes its head record (kind
    :data:`WORKER_HEAD_KIND`, READY), the previous head record moves to the history as
    ``REPLACED``, and the claim of ``owner``'s ``term`` is released, in one change. Needs
    the unexpired claim for candidate ``job_id``, and the worker record live and undrained;
    every record is guarded as read."""
    name = "install_elected_head"
    refused = _owned(doc, name, owner, term, now)
    if refused is not None:
        return refused
    assert doc is not None and doc.election is not None
    record = doc.workers.get(job_id)
    if doc.election.candidate != job_id:
        return Refused(name, f"term {term} elects {doc.election.candidate!r}, not job {job_id}")
    if record is None or record.released or record.drain_deadline is not None:
        return Refused(name, f"job {job_id} is no longer a live, undrained worker allocation")
    refused = check_head_edge(doc, name)
    if refused is not None:
        return refused
    worker = make_pointer("workers", job_id)
    raw_worker = doc.model_dump(mode="json", exclude_unset=True)["workers"][job_id]
    patch: list[Op] = [*_holds(owner, term), lease.unexpired_guard(ELECTION),
                       equals(worker, raw_worker), *replace_head_ops(doc)]
    predecessor = doc.allocation
    head = {"kind": WORKER_HEAD_KIND, "job_id": job_id, "token": record.token,
            "status": "submitted", "config": dict(record.config), "nodes": list(nodes),
            "ray_address": ray_address, "submitted_at": record.submitted_at,
            "promoted_from": predecessor.job_id if predecessor is not None else None}
    return Change(name, (*patch, add(HEAD, head), add_now(f"{HEAD}/ready_at"), *_release()))
