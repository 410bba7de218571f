"""Leases with lifetimes on both stores: exclusivity, expiry, renewal, release, tie-break."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.state import (
    AgentStateStore,
    MemoryStateStore,
    acquire,
    current_holder,
    new_owner_id,
    new_session_document,
    release,
    renew,
)
from dagster_slurm.state.lease import lease_pointer


class Clock:
    """The store's clock (plays the login node) and the caller's monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.local = 50.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.local += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStateStore:
    return MemoryStateStore(new_session_document("dgs-job"), clock=lambda: clock.now)


def test_first_owner_wins_and_others_see_it(store: MemoryStateStore, clock: Clock) -> None:
    grant = acquire(store, "head", "a", ttl=30, monotonic=lambda: clock.local)
    assert grant.acquired and grant.holder is not None and grant.holder.owner == "a"
    assert grant.holder.expires_at == 1030.0 and grant.valid_until == 80.0
    lost = acquire(store, "head", "b", ttl=30)
    assert not lost.acquired and lost.holder is not None and lost.holder.owner == "a"
    assert lost.valid_until is None and not lost.still_valid()


def test_expired_holder_is_dead(store: MemoryStateStore, clock: Clock) -> None:
    acquire(store, "head", "a", ttl=30)
    clock.advance(30)  # expires_at == now counts as expired
    taken = acquire(store, "head", "b", ttl=30)
    assert taken.acquired and taken.holder is not None and taken.holder.owner == "b"
    assert not renew(store, "head", "a", ttl=30).acquired  # the old holder cannot come back


def test_renew_extends_only_an_unexpired_own_lease(store: MemoryStateStore, clock: Clock) -> None:
    acquire(store, "head", "a", ttl=30)
    clock.advance(20)
    renewed = renew(store, "head", "a", ttl=30, monotonic=lambda: clock.local)
    assert renewed.acquired and renewed.holder is not None
    assert renewed.holder.expires_at == 1050.0 and renewed.valid_until == clock.local + 30
    assert not renew(store, "head", "b", ttl=30).acquired
    clock.advance(31)
    assert not renew(store, "head", "a", ttl=30).acquired  # expired, even with no taker


def test_holder_can_reacquire_its_own_lease(store: MemoryStateStore, clock: Clock) -> None:
    acquire(store, "head", "a", ttl=30)
    clock.advance(5)
    again = acquire(store, "head", "a", ttl=30)
    assert again.acquired and again.holder is not None and again.holder.expires_at == 1035.0


def test_release(store: MemoryStateStore, clock: Clock) -> None:
    acquire(store, "head", "a", ttl=30)
    assert not release(store, "head", "b")
    assert release(store, "head", "a")
    doc, _ = store.load()
    assert current_holder(doc, "head", clock.now) is None
    assert acquire(store, "head", "b", ttl=30).acquired


def test_malformed_record_counts_as_expired(store: MemoryStateStore) -> None:
    store.transact([{"op": "add", "path": lease_pointer("head"), "value": {"owner": "x"}}])
    assert acquire(store, "head", "a", ttl=30).acquired


def test_contenders_are_serialised_and_exactly_one_wins(clock: Clock) -> None:
    store = MemoryStateStore(new_session_document("dgs-job"), clock=lambda: clock.now)
    acquire(store, "head", "old", ttl=10)
    clock.advance(11)
    owners = [new_owner_id(pid=i) for i in range(8)]
    grants: dict[str, bool] = {}
    barrier = threading.Barrier(len(owners))

    def contend(owner: str) -> None:
        barrier.wait()
        grants[owner] = acquire(store, "head", owner, ttl=30).acquired

    threads = [threading.Thread(target=contend, args=(o,)) for o in owners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o, won in grants.items() if won]
    assert len(winners) == 1
    doc, _ = store.load()
    holder = current_holder(doc, "head", clock.now)
    assert holder is not None and holder.owner == winners[0]


def test_owner_ids_are_unique() -> None:
    assert new_owner_id() != new_owner_id()
    assert new_owner_id(host="h", pid=1).startswith("h:1:")


def test_leases_on_the_agent_store_use_the_login_node_clock(
    client: AgentClient, tmp_path: Path
) -> None:
    store = AgentStateStore(client, str(tmp_path / "s"), initial=new_session_document("j"))
    grant = acquire(store, "election", "a", ttl=120)
    assert grant.acquired and grant.now is not None and grant.holder is not None
    assert grant.holder.expires_at == pytest.approx(grant.now + 120)
    assert grant.still_valid()
    assert not acquire(store, "election", "b", ttl=120).acquired
    assert renew(store, "election", "a", ttl=120).acquired
    snap = store.snapshot()
    holder = current_holder(snap.doc, "election", snap.now)
    assert holder is not None and holder.owner == "a" and snap.now >= grant.now
    assert release(store, "election", "a")
    assert acquire(store, "election", "b", ttl=0.0).acquired  # ttl 0: expired at once
    assert acquire(store, "election", "c", ttl=60).acquired
