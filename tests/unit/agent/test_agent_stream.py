"""The agent's serve mode and the client's pool of persistent agent processes."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from dagster_slurm.agent import exec_op, read_op, txn_op
from dagster_slurm.agent.client import AgentClient
from dagster_slurm.errors import TransportError
from dagster_slurm.transport.local import LocalTransport


@pytest.fixture
def persistent(tmp_path: Path, transport: LocalTransport) -> AgentClient:
    client = AgentClient(transport, str(tmp_path / "base"), python=sys.executable, persistent=True)
    yield client
    client.close()


def _agent_pids(client: AgentClient) -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if client.program_path.encode() in cmdline and b"--serve" in cmdline:
                pids.add(int(entry))
    # A child the agent forks for an ``exec`` op shows the agent's command line until it
    # execs; count serving processes only.
    return {pid for pid in pids if _parent(pid) not in pids}


def _parent(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_one_process_serves_many_requests(persistent: AgentClient, tmp_path: Path) -> None:
    doc = str(tmp_path / "doc.json")
    for _ in range(20):
        assert persistent.run(txn_op(doc, doc + ".lock", [{"op": "incr", "path": "/n", "value": 1}],
                                     create={"schema_version": 1, "n": 0})).ok
    assert persistent.run(read_op(doc)).doc["n"] == 20
    assert len(_agent_pids(persistent)) == 1, "requests must reuse the serving process"
    # install round trip + 21 requests
    assert persistent.transport.stats.round_trips == 22


def test_close_ends_the_serving_processes(persistent: AgentClient) -> None:
    persistent.run(exec_op(["true"]))
    assert _agent_pids(persistent)
    persistent.close()
    assert not _agent_pids(persistent)
    # still usable afterwards: a new process is started
    assert persistent.run(exec_op(["echo", "again"])).stdout == "again\n"


def test_concurrent_callers_use_at_most_max_streams(persistent: AgentClient) -> None:
    seen: list[int] = []
    barrier = threading.Barrier(6)

    def call() -> None:
        barrier.wait()
        persistent.run(exec_op(["sleep", "0.2"]))
        seen.append(len(_agent_pids(persistent)))

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) <= 2 and len(_agent_pids(persistent)) <= 2


def _wait_until_ended(pid: int, deadline: float = 10.0) -> None:
    """Until process ``pid`` has ended (a zombie or gone), at most ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not end within {deadline} s")


def test_an_agent_that_ended_while_idle_is_replaced_and_the_request_sent_again(
        persistent: AgentClient, caplog: pytest.LogCaptureFixture) -> None:
    persistent.run(exec_op(["true"]))
    (pid,) = _agent_pids(persistent)
    os.kill(pid, 9)
    _wait_until_ended(pid)
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.agent"):
        assert persistent.run(exec_op(["echo", "ok"])).stdout == "ok\n"
    assert [r.getMessage() for r in caplog.records] == [
        "the cluster-side agent process on the login node had ended (killed by signal 9) "
        "before a request reached it; the SSH connection is up, so a new agent process was "
        "started and the request sent to it"
    ]
    assert "Socket is closed" not in caplog.text and "Broken pipe" not in caplog.text
    assert _agent_pids(persistent) and pid not in _agent_pids(persistent)


def test_an_agent_that_ends_during_a_request_says_the_outcome_is_unknown(
        persistent: AgentClient) -> None:
    persistent.run(exec_op(["true"]))
    with pytest.raises(TransportError) as caught:
        persistent.run(exec_op(["sh", "-c", "kill -9 $PPID"]))
    assert str(caught.value).startswith(
        "the cluster-side agent process on the login node ended while handling a request "
        "(killed by signal 9); the SSH connection is up. Whether the request ran is unknown; "
        "the next request starts a new agent process."
    )
    assert persistent.run(exec_op(["echo", "ok"])).stdout == "ok\n"
