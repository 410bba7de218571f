"""Session schema and the two state stores, which must behave identically."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import DocumentError, PatchRejected
from dagster_slurm.state import (
    SCHEMA_VERSION,
    AgentStateStore,
    MemoryStateStore,
    SessionDocument,
    StateStore,
    make_pointer,
    new_session_document,
)


@pytest.fixture(params=["memory", "agent"])
def store(request: pytest.FixtureRequest, client: AgentClient, tmp_path: Path) -> StateStore:
    initial = new_session_document("dgs-job", run_id="run-1", created_at=1.0)
    if request.param == "memory":
        return MemoryStateStore(initial)
    return AgentStateStore(client, str(tmp_path / "session"), initial=initial)


def test_new_document_matches_the_schema() -> None:
    doc = new_session_document("dgs-job", run_id="r", created_at=5.0, tags={"k": "v"})
    assert doc["schema_version"] == SCHEMA_VERSION == 1 and doc["version"] == 0
    assert doc["workers"] == {} and doc["worker_submissions"] == {} and doc["leases"] == {}
    assert doc["allocation"] is None and doc["successor"] is None and doc["election"] is None
    assert SessionDocument.from_dict(doc).to_dict() == doc


def test_unknown_keys_survive_a_round_trip() -> None:
    doc = new_session_document("dgs-job")
    doc["from_the_future"] = {"x": [1, 2]}
    doc["workers"]["7"] = {"job_id": "7", "intent": "gpu", "drain_deadline": 10.0, "new": True}
    doc["allocation"] = {"job_id": "5", "status": "running", "extra": "kept"}
    model = SessionDocument.from_dict(doc)
    assert model.workers["7"].drain_deadline == 10.0 and model.allocation is not None
    again = model.to_dict()
    assert again["from_the_future"] == {"x": [1, 2]}
    assert again["workers"]["7"]["new"] is True and again["allocation"]["extra"] == "kept"


def test_first_transaction_creates_from_initial(store: StateStore) -> None:
    assert store.load() == (None, 0)
    result = store.transact([{"op": "add", "path": "/tags/owner", "value": "me"}])
    assert result.ok and result.version == 1 and result.written
    doc, version = store.load()
    assert version == 1 and doc is not None
    model = SessionDocument.from_dict(doc)
    assert model.job_name == "dgs-job" and model.tags == {"owner": "me"} and model.version == 1


def test_conflicts_and_compare_and_set(store: StateStore) -> None:
    store.transact([])
    doc, version = store.load()
    assert doc is not None
    pointer = make_pointer("workers", "12")
    worker = {"job_id": "12", "intent": None}
    assert store.transact(
        [{"op": "absent", "path": pointer}, {"op": "add", "path": pointer, "value": worker}]
    ).ok
    again = store.transact(
        [{"op": "absent", "path": pointer}, {"op": "add", "path": pointer, "value": worker}]
    )
    assert not again.ok and again.conflict is not None and again.conflict["actual"] == worker
    assert not store.save({**doc, "tags": {"stale": "yes"}}, expected_version=version).ok
    _, current = store.load()
    saved = store.save({**doc, "tags": {"fresh": "yes"}}, expected_version=current)
    assert saved.ok and saved.doc is not None and saved.doc["tags"] == {"fresh": "yes"}
    assert saved.version == current + 1


def test_errors_are_the_same_exceptions(store: StateStore) -> None:
    store.transact([])
    with pytest.raises(PatchRejected):
        store.transact([{"op": "add", "path": "/nope/deeper", "value": 1}])
    store.transact([{"op": "replace", "path": "/schema_version", "value": SCHEMA_VERSION + 1}])
    with pytest.raises(DocumentError, match="schema_version"):
        store.transact([{"op": "add", "path": "/tags/x", "value": "y"}])


SCRIPT: list[list[dict[str, Any]]] = [
    [{"op": "incr", "path": "/counter", "value": 1}],
    [{"op": "test", "path": "/counter", "value": 2}, {"op": "add", "path": "/x", "value": 1}],
    [{"op": "setdefault", "path": "/workers/9", "value": {"job_id": "9"}}],
    [{"op": "add", "path": "/workers/9/ray_node_ids", "value": {"n1": "abc"}}],
    [{"op": "max", "path": "/counter", "value": 0}],
    [{"op": "remove", "path": "/workers/9"}, {"op": "absent", "path": "/workers/9"}],
    [
        {"op": "test", "path": "/version", "value": 4},
        {"op": "incr", "path": "/counter", "value": 5},
    ],
    [{"op": "test", "path": "/workers", "cmp": "lt", "value": 1}],
]


def test_memory_and_agent_stores_agree(client: AgentClient, tmp_path: Path) -> None:
    initial = new_session_document("dgs-job")
    memory = MemoryStateStore(initial)
    agent = AgentStateStore(client, str(tmp_path / "s"), initial=initial)
    for patch in SCRIPT:
        a, b = memory.transact(patch), agent.transact(patch)
        assert (a.ok, a.doc, a.version, a.conflict, a.written) == (
            b.ok,
            b.doc,
            b.version,
            b.conflict,
            b.written,
        ), patch
    assert memory.load() == agent.load()
    on_disk = json.loads((tmp_path / "s" / "allocation.json").read_text())
    assert on_disk == agent.load()[0]


def test_memory_store_is_thread_safe() -> None:
    store = MemoryStateStore({})
    patch = [{"op": "incr", "path": "/n", "value": 1}]

    def work() -> None:
        for _ in range(200):
            assert store.transact(patch).ok

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    doc, version = store.load()
    assert doc is not None and doc["n"] == 1600 and version == 1600


def test_memory_store_uses_its_clock_for_value_now() -> None:
    store = MemoryStateStore({}, clock=lambda: 1000.0)
    result = store.transact([{"op": "add", "path": "/deadline", "value_now": 30}])
    assert result.now == 1000.0 and result.doc is not None and result.doc["deadline"] == 1030.0
    snap = store.snapshot()
    assert (snap.now, snap.version, snap.doc) == (1000.0, 1, result.doc)


def test_missing_document_without_initial() -> None:
    with pytest.raises(DocumentError):
        MemoryStateStore().transact([])
