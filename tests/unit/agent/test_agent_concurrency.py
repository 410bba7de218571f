"""Many processes, one document: every transaction is serialised by the lock."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agent_support import SRC

#: Eight writers at once contend for the lock on every one of their transactions; a dozen
#: each is enough for them to overlap (each transaction starts the agent program afresh).
PROCESSES = 8
INCREMENTS = 12

_WORKER = """
import sys
sys.path.insert(0, {src!r})
from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import txn_op
from dagster_slurm.transport.local import LocalTransport

transport = LocalTransport()
client = AgentClient(transport, {base!r}, python=sys.executable)
patch = [{{"op": "incr", "path": "/counter", "value": 1}}]
for _ in range({n}):
    result = client.run(txn_op({doc!r}, {lock!r}, patch, lock_timeout=60, create={{}}))
    assert result.ok, result
print(transport.stats.round_trips)
"""


@pytest.mark.slow  # 10-20 s on two cores: 96 transactions, each an agent process
def test_concurrent_increments_are_never_lost(tmp_path: Path) -> None:
    base, doc, lock = tmp_path / "base", tmp_path / "s" / "allocation.json", tmp_path / "s" / "lock"
    code = textwrap.dedent(
        _WORKER.format(src=SRC, base=str(base), doc=str(doc), lock=str(lock), n=INCREMENTS)
    )
    start = time.monotonic()
    workers = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(PROCESSES)
    ]
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    elapsed = time.monotonic() - start
    assert [w.returncode for w in workers] == [0] * PROCESSES
    final = json.loads(doc.read_text())
    assert final["counter"] == PROCESSES * INCREMENTS
    assert final["version"] == PROCESSES * INCREMENTS
    # one round trip per increment, plus at most one install (and retry) per process
    assert sum(int(o) for o in outputs) <= PROCESSES * (INCREMENTS + 2)
    assert not lock.exists()
    print(f"{PROCESSES * INCREMENTS} transactions in {elapsed:.1f} s")
