"""State transactions and reads through the real agent program (LocalTransport)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from agent_support import PYTHON, SRC

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import DocumentError, PatchRejected
from dagster_slurm.agent.ops import read_op, txn_op
from dagster_slurm.agent.results import TxnResult


@pytest.fixture
def doc_path(tmp_path: Path) -> Path:
    return tmp_path / "session" / "allocation.json"


def txn(client: AgentClient, doc_path: Path, patch: list[Any], **kw: Any) -> TxnResult:
    lock = str(doc_path.parent / "lock")
    return client.run(txn_op(str(doc_path), lock, patch, **kw))


def test_create_then_versions_increase_by_one(client: AgentClient, doc_path: Path) -> None:
    first = txn(
        client,
        doc_path,
        [{"op": "incr", "path": "/n", "value": 1}],
        create={"schema_version": 1, "n": 0},
    )
    second = txn(client, doc_path, [{"op": "incr", "path": "/n", "value": 1}], create={})
    assert first.ok and first.written and first.version == 1
    assert second.version == 2 and second.doc == {"schema_version": 1, "n": 2, "version": 2}
    assert json.loads(doc_path.read_text()) == second.doc
    assert not (doc_path.parent / "lock").exists()


def test_conflict_writes_nothing_and_returns_the_current_doc(
    client: AgentClient, doc_path: Path
) -> None:
    txn(client, doc_path, [{"op": "add", "path": "/owner", "value": "a"}], create={})
    before = doc_path.read_bytes(), doc_path.stat().st_mtime_ns
    result = txn(
        client,
        doc_path,
        [
            {"op": "replace", "path": "/owner", "value": "b"},
            {"op": "test", "path": "/owner", "value": "a"},
        ],
    )
    assert not result.ok and not result.written
    assert result.conflict is not None and result.conflict["index"] == 1
    assert result.conflict["actual"] == "b"  # evaluated after the earlier op of the patch
    assert result.doc == {"owner": "a", "version": 1} and result.version == 1
    assert (doc_path.read_bytes(), doc_path.stat().st_mtime_ns) == before


def test_patch_error_raises_and_writes_nothing(client: AgentClient, doc_path: Path) -> None:
    txn(client, doc_path, [], create={"n": 1})
    before = doc_path.read_bytes()
    with pytest.raises(PatchRejected) as info:
        txn(
            client,
            doc_path,
            [{"op": "incr", "path": "/n", "value": 1}, {"op": "add", "path": "/a/b", "value": 1}],
        )
    assert info.value.details["doc"] == {"n": 1, "version": 1}
    assert doc_path.read_bytes() == before


def test_unchanged_document_is_not_rewritten(client: AgentClient, doc_path: Path) -> None:
    txn(client, doc_path, [], create={"n": 1})
    stamp = doc_path.stat().st_mtime_ns
    result = txn(
        client,
        doc_path,
        [
            {"op": "test", "path": "/n", "value": 1},
            {"op": "setdefault", "path": "/n", "value": 5},
            {"op": "max", "path": "/n", "value": 0},
        ],
    )
    assert result.ok and not result.written and result.version == 1
    assert doc_path.stat().st_mtime_ns == stamp


def test_booleans_and_numbers_are_different_values(client: AgentClient, doc_path: Path) -> None:
    txn(client, doc_path, [], create={"flag": 1})
    result = txn(client, doc_path, [{"op": "replace", "path": "/flag", "value": True}])
    assert result.written and result.version == 2 and result.doc == {"flag": True, "version": 2}


def test_version_is_testable_but_not_writable(client: AgentClient, doc_path: Path) -> None:
    txn(client, doc_path, [], create={})
    assert not txn(client, doc_path, [{"op": "test", "path": "/version", "value": 0}]).ok
    assert (
        txn(
            client,
            doc_path,
            [
                {"op": "test", "path": "/version", "value": 1},
                {"op": "add", "path": "/x", "value": 1},
            ],
        ).version
        == 2
    )
    with pytest.raises(PatchRejected, match="maintained by the store"):
        txn(client, doc_path, [{"op": "replace", "path": "/version", "value": 99}])
    whole = txn(client, doc_path, [{"op": "replace", "path": "", "value": {"version": 99}}])
    assert whole.doc == {"version": 3}


def test_missing_document_without_create(client: AgentClient, doc_path: Path) -> None:
    doc_path.parent.mkdir()
    with pytest.raises(DocumentError, match="does not exist"):
        txn(client, doc_path, [{"op": "add", "path": "/x", "value": 1}])
    assert not doc_path.exists()


def test_newer_schema_is_never_modified(client: AgentClient, doc_path: Path) -> None:
    txn(client, doc_path, [], create={"schema_version": 2})
    before = doc_path.read_bytes()
    with pytest.raises(DocumentError, match="schema_version 2"):
        txn(client, doc_path, [{"op": "add", "path": "/x", "value": 1}], max_schema_version=1)
    assert doc_path.read_bytes() == before


def test_value_now_is_the_login_node_clock(client: AgentClient, doc_path: Path) -> None:
    before = time.time()
    result = txn(client, doc_path, [{"op": "add", "path": "/deadline", "value_now": 60}], create={})
    assert result.now is not None and before <= result.now <= time.time()
    assert result.doc is not None and result.doc["deadline"] == result.now + 60


def test_read_without_lock(client: AgentClient, doc_path: Path) -> None:
    missing = client.run(read_op(str(doc_path)))
    assert (missing.exists, missing.doc, missing.version) == (False, None, 0)
    txn(client, doc_path, [{"op": "add", "path": "/a", "value": [1]}], create={})
    (doc_path.parent / "lock").mkdir()  # a held lock does not block readers
    found = client.run(read_op(str(doc_path)))
    assert found.exists and found.doc == {"a": [1], "version": 1} and found.version == 1


def test_corrupt_document_is_reported(client: AgentClient, doc_path: Path) -> None:
    doc_path.parent.mkdir()
    doc_path.write_text("{half")
    with pytest.raises(DocumentError, match="not valid JSON"):
        client.run(read_op(str(doc_path)))


_WRITER = """
import sys
sys.path.insert(0, {src!r})
from dagster_slurm.agent.remote.document import encode_document, write_atomic
i = 0
print("go", flush=True)
while True:
    i += 1
    write_atomic({path!r}, encode_document({{"i": i, "pad": "x" * ((i % 50) * 4000)}}))
"""


def test_killed_writer_never_leaves_a_partial_document(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text('{"i": 0}')
    for round_ in range(3):
        code = textwrap.dedent(_WRITER.format(src=SRC, path=str(path)))
        writer = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline() == "go\n"
        deadline = time.monotonic() + 0.3 + 0.1 * round_
        reads = 0
        while time.monotonic() < deadline:
            json.loads(path.read_bytes())  # never partial
            reads += 1
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        assert json.loads(path.read_bytes())["i"] > 0
        assert reads > 10
