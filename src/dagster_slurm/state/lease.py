"""Leases with lifetimes in the session document, for head elections and other exclusive roles.

A lease lives at ``/leases/<name>`` as ``{owner, acquired_at, renewed_at, expires_at, ttl}``.
Acquire, renew and release are patches run by a
:class:`~dagster_slurm.state.store.StateStore`; their times come from the store's clock at
commit (``value_now``: the login node's clock for the agent store), never from the caller's
clock, so processes on different hosts compare the same time.

Guarantees:

* At most one unexpired holder: acquisition commits only if the lease is absent, expired at
  the transaction's clock, or already held by the same owner — a compare-and-set on the
  exact record seen, so a renewal or takeover in between makes it fail.
* Expired holders are dead: once ``expires_at`` passes, anyone may take the lease, and the
  old holder's :func:`renew` fails even if nobody took it (the holder must acquire again and
  assume it lost exclusivity in between). A malformed lease record counts as expired.
* Deterministic tie-break: contenders are serialised by the store's transactions; the first
  to commit wins and every later one sees it as the holder. ``expires_at == now`` counts as
  expired.
* A local deadline without synchronised clocks: :attr:`LeaseGrant.valid_until` is the
  caller's monotonic time when the winning transaction was *sent* plus ``ttl``, never later
  than the store-side expiry. Act as the holder only before it.

Non-guarantees: no fairness between contenders; a holder paused past ``valid_until`` that
keeps acting breaks exclusivity, so check :meth:`LeaseGrant.still_valid` before each
exclusive action. Owner ids must be unique per process (:func:`new_owner_id`).

The lease primitives — :func:`take_guards`, :func:`holder_guard`, :func:`expired_guard`,
:func:`unexpired_guard`, :func:`expiry` and :func:`has_expired` — work on any record with an
owner field and an ``expires_at``: the patches here use them on ``/leases/<name>``, and the
head election's claim (:mod:`dagster_slurm.state.election_transitions`) on ``/election``,
whose owner field is ``claimed_by``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dagster_slurm.agent.remote.patch import json_equal, make_pointer
from dagster_slurm.state.patches import (
    absent,
    add,
    add_now,
    compare_now,
    equals,
    remove,
    replace_now,
    setdefault,
)
from dagster_slurm.state.schema import Lease
from dagster_slurm.state.store import StateStore


@dataclass(frozen=True)
class LeaseGrant:
    """Outcome of :func:`acquire`/:func:`renew`.

    ``acquired`` is True when the caller holds the lease afterwards; ``holder`` is the holder
    the store reported (None when nobody holds it); ``valid_until`` is the caller's local
    monotonic deadline (None when not acquired); ``now`` is the store's clock.
    """

    acquired: bool
    holder: Lease | None
    valid_until: float | None
    now: float | None
    version: int

    def still_valid(self, monotonic: Callable[[], float] = time.monotonic) -> bool:
        """True while the caller may act as holder."""
        return self.valid_until is not None and monotonic() < self.valid_until


def new_owner_id(host: str | None = None, pid: int | None = None) -> str:
    """A unique owner id: ``host:pid:random`` (the random part tells restarts apart)."""
    host = host or socket.gethostname()
    pid = os.getpid() if pid is None else pid
    return f"{host}:{pid}:{os.urandom(4).hex()}"


def lease_pointer(name: str) -> str:
    """The pointer of lease ``name`` in its document (``/leases/<name>``, escaped)."""
    return make_pointer("leases", name)


# -- the lease primitives ------------------------------------------------------------------------
def has_expired(expires_at: float | None, now: float) -> bool:
    """True once ``now`` (the store's clock) reaches ``expires_at``; the boundary counts as
    expired, and so does a record without an expiry."""
    return expires_at is None or now >= expires_at


def take_guards(pointer: str, previous: Mapping[str, Any] | None, *,
                takeover: bool) -> list[dict[str, Any]]:
    """Guards of taking the lease-like record at ``pointer``: it is still exactly
    ``previous`` as read (None: there is none), and, when ``takeover`` (another holder's
    record), expired at the store's clock at commit."""
    if previous is None:
        return [absent(pointer)]
    guards = [equals(pointer, dict(previous))]
    if takeover:
        guards.append(expired_guard(pointer))
    return guards


def holder_guard(pointer: str, owner: str, field: str = "owner") -> dict[str, Any]:
    """Guard: the record at ``pointer`` is held by ``owner`` (its ``field``)."""
    return equals(f"{pointer}/{field}", owner)


def expired_guard(pointer: str) -> dict[str, Any]:
    """Guard: the record at ``pointer`` expired at the store's clock at commit."""
    return compare_now(pointer + "/expires_at", "le")


def unexpired_guard(pointer: str) -> dict[str, Any]:
    """Guard: the record at ``pointer`` has not expired at the store's clock at commit."""
    return compare_now(pointer + "/expires_at", "gt")


def expiry(pointer: str, ttl: float) -> dict[str, Any]:
    """Set the record's ``expires_at`` to ``ttl`` seconds from the store's clock."""
    return add_now(pointer + "/expires_at", ttl)


# -- the patches of a named lease ----------------------------------------------------------------
def acquire_patch(
    name: str, owner: str, ttl: float, previous: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Take the lease if it still is exactly ``previous`` (None: if there is no lease).

    Taking another owner's lease also requires it to be expired at the store's clock.
    """
    pointer = lease_pointer(name)
    lease = _parse(previous)
    parent = [setdefault("/leases", {})] if previous is None else []
    guards = take_guards(pointer, previous, takeover=lease is not None and lease.owner != owner)
    return parent + guards + [
        add(pointer, {"owner": owner, "ttl": ttl}),
        add_now(pointer + "/acquired_at"),
        add_now(pointer + "/renewed_at"),
        expiry(pointer, ttl),
    ]


def renew_patch(name: str, owner: str, ttl: float) -> list[dict[str, Any]]:
    """Extend the lease to ``now + ttl`` if ``owner`` holds it and it has not expired."""
    pointer = lease_pointer(name)
    return [
        holder_guard(pointer, owner),
        unexpired_guard(pointer),
        replace_now(pointer + "/renewed_at"),
        replace_now(pointer + "/expires_at", ttl),
        add(pointer + "/ttl", ttl),
    ]


def release_patch(name: str, owner: str) -> list[dict[str, Any]]:
    """Remove the lease if ``owner`` holds it (expired or not)."""
    pointer = lease_pointer(name)
    return [holder_guard(pointer, owner), remove(pointer)]


def fence_patch(name: str, owner: str) -> list[dict[str, Any]]:
    """The guard of a write made under the lease: it applies only while ``owner`` still
    holds it (a holder that stalled past its lease, the lease taken over meanwhile, writes
    nothing)."""
    return [holder_guard(lease_pointer(name), owner)]


def current_holder(doc: Mapping[str, Any] | None, name: str, now: float) -> Lease | None:
    """The unexpired holder of lease ``name`` in ``doc`` at ``now``, or None."""
    lease = _parse(_record(doc, name))
    return None if lease is None or lease.expired(now) else lease


def acquire(
    store: StateStore,
    name: str,
    owner: str,
    ttl: float,
    *,
    attempts: int = 3,
    monotonic: Callable[[], float] = time.monotonic,
) -> LeaseGrant:
    """Take lease ``name`` for ``owner`` unless another owner holds it unexpired.

    Optimistic: the first attempt assumes no lease exists; a conflict returns the current
    record, and the next attempt compares-and-sets against it. At most ``attempts``
    transactions.
    """
    previous: Mapping[str, Any] | None = None
    grant = LeaseGrant(False, None, None, None, 0)
    for _ in range(attempts):
        sent = monotonic()
        result = store.transact(acquire_patch(name, owner, ttl, previous))
        record = _record(result.doc, name)
        lease = _parse(record)
        if result.ok:
            return LeaseGrant(True, lease, sent + ttl, result.now, result.version)
        now = result.now if result.now is not None else float("inf")
        grant = LeaseGrant(False, lease, None, result.now, result.version)
        if lease is not None and lease.owner != owner and not lease.expired(now):
            return grant
        if record is not None and previous is not None and json_equal(record, previous):
            return grant  # the record did not change yet the takeover failed: give up
        previous = record
    return grant


def renew(
    store: StateStore,
    name: str,
    owner: str,
    ttl: float,
    *,
    monotonic: Callable[[], float] = time.monotonic,
) -> LeaseGrant:
    """Extend a held, unexpired lease; ``acquired`` False means the lease was lost."""
    sent = monotonic()
    result = store.transact(renew_patch(name, owner, ttl))
    lease = _parse(_record(result.doc, name))
    valid_until = sent + ttl if result.ok else None
    return LeaseGrant(result.ok, lease, valid_until, result.now, result.version)


def release(store: StateStore, name: str, owner: str) -> bool:
    """Give the lease up; False when ``owner`` did not hold it (nothing changed)."""
    return store.transact(release_patch(name, owner)).ok


def _record(doc: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    leases = (doc or {}).get("leases")
    record = leases.get(name) if isinstance(leases, Mapping) else None
    return record if isinstance(record, Mapping) else None


def _parse(record: Mapping[str, Any] | None) -> Lease | None:
    if record is None:
        return None
    try:
        return Lease.model_validate(dict(record))
    except ValidationError:
        return None
