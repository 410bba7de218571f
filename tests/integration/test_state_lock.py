"""The session lock and state transactions over SSH, on the dev cluster's login node."""

from __future__ import annotations

import multiprocessing
import uuid

import pytest

from dagster_slurm import SlurmResource
from dagster_slurm.errors import LockTimeout
from dagster_slurm.state.store import AgentStateStore

pytestmark = pytest.mark.integration

HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from dagster_slurm_agent.lock import acquire
acquire(sys.argv[2], timeout=10, purpose="test holder")
print("locked", flush=True)
time.sleep(float(sys.argv[3]))
"""


@pytest.fixture
def slurm(slurm_cluster) -> SlurmResource:
    return SlurmResource.from_env(environ=slurm_cluster.env())


@pytest.fixture
def session_dir(slurm) -> str:
    path = f"{slurm.base_path()}/test-state/{uuid.uuid4().hex[:12]}"
    from dagster_slurm.agent import mkdir_op

    slurm.agent().run(mkdir_op(path))
    return path


def _increment(env: dict[str, str], session_dir: str, count: int) -> int:
    slurm = SlurmResource.from_env(environ=env)
    store = AgentStateStore(slurm.agent(), session_dir, initial={"schema_version": 1, "counter": 0})
    for _ in range(count):
        assert store.transact([{"op": "incr", "path": "/counter", "value": 1}]).ok
    return slurm.ssh.get_transport().stats.connects


@pytest.mark.slow
def test_eight_processes_fifty_transactions_each_count_exactly(slurm_cluster, slurm, session_dir):
    slurm.agent().install()  # one install up front, not eight racing ones
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        logins = pool.starmap(_increment, [(slurm_cluster.env(), session_dir, 50)] * 8)
    assert logins == [1] * 8, "each process must log in exactly once"
    doc, version = AgentStateStore(slurm.agent(), session_dir).load()
    assert doc["counter"] == 400
    assert version == 400


def _start_holder(slurm, lock: str, seconds: float) -> int:
    """A process on the login node that takes ``lock`` and sleeps; returns its pid."""
    transport = slurm.ssh.get_transport()
    agent = slurm.agent()
    agent.install()
    result = transport.run(
        ["sh", "-c", 'python3 -c "$1" "$2" "$3" "$4" > "$3.out" 2>&1 & echo $!; '
         'for i in $(seq 100); do grep -q locked "$3.out" 2>/dev/null && exit 0; sleep 0.05; done; exit 1',
         "sh", HOLDER, agent.program_path, lock, str(seconds)],
    )
    assert result.ok, result.stderr
    return int(result.stdout.split()[0])


def test_sigkilled_lock_holder_is_detected_and_broken(slurm, session_dir):
    store = AgentStateStore(slurm.agent(), session_dir, initial={"schema_version": 1}, lock_timeout=10)
    pid = _start_holder(slurm, store.lock_path, 600)
    assert slurm.ssh.get_transport().run(["kill", "-KILL", str(pid)]).ok
    result = store.transact([{"op": "add", "path": "/after_kill", "value": True}])
    assert result.ok and result.doc["after_kill"] is True
    assert any("broke stale lock" in w and str(pid) in w for w in result.warnings), result.warnings


def test_wedged_live_holder_times_out_naming_the_owner(slurm, session_dir):
    store = AgentStateStore(slurm.agent(), session_dir, initial={"schema_version": 1}, lock_timeout=2)
    pid = _start_holder(slurm, store.lock_path, 60)
    try:
        with pytest.raises(LockTimeout) as info:
            store.transact([{"op": "add", "path": "/x", "value": 1}])
        message = str(info.value)
        assert store.lock_path in message and str(pid) in message
    finally:
        slurm.ssh.get_transport().run(["kill", "-TERM", str(pid)])
