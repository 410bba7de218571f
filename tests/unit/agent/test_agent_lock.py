"""The directory lock: live holders are respected, dead ones on this host are broken."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from agent_support import start_lock_holder

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import AgentLockTimeout
from dagster_slurm.agent.ops import txn_op
from dagster_slurm.agent.remote import lock as lockmod
from dagster_slurm.agent.remote.common import OpError
from dagster_slurm.agent.results import TxnResult
from dagster_slurm.errors import LockTimeout

Paths = tuple[Path, Path]


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return tmp_path / "allocation.json", tmp_path / "lock"


def bump(client: AgentClient, paths: Paths, timeout: float = 5.0) -> TxnResult:
    doc, lock = paths
    patch = [{"op": "incr", "path": "/n", "value": 1}]
    return client.run(txn_op(str(doc), str(lock), patch, lock_timeout=timeout, create={}))


def write_owner(lock: Path, **fields: object) -> None:
    lock.mkdir()
    owner = {**lockmod.host_identity(), "acquired_at": time.time(), "purpose": "fake"}
    owner.update(fields)
    (lock / lockmod.OWNER_FILE).write_text(json.dumps(owner))


def test_sigkilled_holder_is_detected_and_broken(client: AgentClient, paths: Paths) -> None:
    holder = start_lock_holder(paths[1], purpose="doomed")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    result = bump(client, paths)
    assert result.ok and result.doc == {"n": 1, "version": 1}
    (warning,) = result.warnings
    assert f"pid {holder.pid} on host {socket.gethostname()}" in warning
    assert "'doomed'" in warning and "no longer running" in warning
    assert not paths[1].exists()
    assert not list(paths[1].parent.glob("lock.*"))  # grave and guard are cleaned up


def test_zombie_holder_counts_as_dead(client: AgentClient, paths: Paths) -> None:
    holder = start_lock_holder(paths[1])
    os.kill(holder.pid, signal.SIGKILL)
    time.sleep(0.2)  # not reaped yet: still in the process table
    try:
        result = bump(client, paths)
        assert result.ok and "has exited" in result.warnings[0]
    finally:
        holder.wait()


def test_wedged_live_holder_times_out_naming_lock_and_owner(
    client: AgentClient,
    paths: Paths,
) -> None:
    holder = start_lock_holder(paths[1], purpose="wedged")
    try:
        start = time.monotonic()
        with pytest.raises(AgentLockTimeout) as info:
            bump(client, paths, timeout=0.5)
        elapsed = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert isinstance(info.value, LockTimeout)
    message = str(info.value)
    assert str(paths[1]) in message
    assert f"pid {holder.pid} on host {socket.gethostname()}" in message
    assert "held for" in message and "'wedged'" in message
    assert info.value.details["owner"]["pid"] == holder.pid
    assert 0.5 <= elapsed < 5
    assert not paths[0].exists()


def test_live_holder_is_never_broken_however_old(paths: Paths) -> None:
    lock = paths[1]
    me = lockmod.process_stat(os.getpid())
    assert me is not None
    write_owner(lock, pid=os.getpid(), start_time=me[1], acquired_at=0.0)
    os.utime(lock, (0, 0))
    with pytest.raises(OpError) as info:
        lockmod.acquire(str(lock), timeout=0.2)
    assert info.value.type == "LockTimeout"
    assert lock.exists()


def test_reused_pid_is_detected_by_start_time(paths: Paths) -> None:
    lock = paths[1]
    me = lockmod.process_stat(os.getpid())
    assert me is not None
    write_owner(lock, pid=os.getpid(), start_time=me[1] + 1)
    warnings: list[str] = []
    handle = lockmod.acquire(str(lock), timeout=1, warnings=warnings)
    assert "now belongs to another process" in warnings[0]
    assert lockmod.release(handle) == []


def test_owner_on_another_host_without_a_lease_is_never_broken(paths: Paths) -> None:
    dead = _dead_pid()  # would be stale if the owner were on this host
    write_owner(paths[1], host="login-elsewhere", pid=dead, acquired_at=0.0)
    with pytest.raises(OpError) as info:
        lockmod.acquire(str(paths[1]), timeout=0.2)
    assert f"pid {dead} on host login-elsewhere" in info.value.message
    assert "another host" in info.value.message


def test_owner_on_another_login_node_is_judged_by_its_lease_never_by_its_pid(
    paths: Paths,
) -> None:
    me = lockmod.process_stat(os.getpid())
    assert me is not None
    # the pid and start time of a live process here: on another node they mean nothing
    write_owner(paths[1], host="login1", pid=os.getpid(), start_time=me[1],
                acquired_at=100.0, lease=3.0, expires_at=103.0)
    with pytest.raises(OpError) as info:
        lockmod.acquire(str(paths[1]), timeout=0.2, clock=lambda: 102.5)
    assert "broken once its lease expires (in 0.5 s)" in info.value.message
    warnings: list[str] = []
    handle = lockmod.acquire(str(paths[1]), timeout=0.2, warnings=warnings,
                             clock=lambda: 103.0)
    assert len(warnings) == 1 and "lease expired 0.0 s ago" in warnings[0]
    assert "host login1" in warnings[0]
    assert lockmod.release(handle) == []


def test_dead_owner_on_another_login_node_waits_for_its_lease(paths: Paths) -> None:
    write_owner(paths[1], host="login1", pid=_dead_pid(), acquired_at=100.0, lease=20.0,
                expires_at=120.0)
    with pytest.raises(OpError):
        lockmod.acquire(str(paths[1]), timeout=0.2, clock=lambda: 119.9)


def test_same_host_in_another_pid_namespace_is_judged_by_the_lease() -> None:
    me = {"host": "login", "boot_id": "b", "pid_ns": "pid:[1]"}
    owner = {"host": "login", "boot_id": "b", "pid_ns": "pid:[2]", "pid": 7,
             "expires_at": 50.0}
    assert lockmod.stale_reason(owner, 1.0, me, 5.0, now=49.0) is None
    reason = lockmod.stale_reason(owner, 1.0, me, 5.0, now=51.0)
    assert reason is not None and "lease expired 1.0 s ago" in reason


def test_a_live_holder_of_this_host_outlives_its_lease(paths: Paths) -> None:
    me = lockmod.process_stat(os.getpid())
    assert me is not None
    write_owner(paths[1], pid=os.getpid(), start_time=me[1], acquired_at=0.0, lease=1.0,
                expires_at=1.0)
    with pytest.raises(OpError):
        lockmod.acquire(str(paths[1]), timeout=0.2)


def test_malformed_expiry_never_counts_as_expired() -> None:
    me = {"host": "login2", "boot_id": None, "pid_ns": None}
    for expires_at in (None, True, "0", [1]):
        owner = {"host": "login1", "pid": 7, "expires_at": expires_at}
        assert lockmod.stale_reason(owner, 1.0, me, 5.0, now=1e12) is None


def test_the_owner_record_carries_the_lease_and_renew_extends_it(paths: Paths) -> None:
    handle = lockmod.acquire(str(paths[1]), timeout=1, clock=lambda: 1000.0, lease=4.0)
    written = json.loads((paths[1] / lockmod.OWNER_FILE).read_text())
    assert (written["lease"], written["expires_at"]) == (4.0, 1004.0)
    assert lockmod.renew(handle, 1010.0)
    written = json.loads((paths[1] / lockmod.OWNER_FILE).read_text())
    assert written["expires_at"] == 1014.0 and written["token"] == handle.owner["token"]
    assert lockmod.release(handle) == []
    assert not lockmod.renew(handle, 1020.0)


def test_ownerless_lock_is_stale_only_after_the_grace_period(paths: Paths) -> None:
    lock = paths[1]
    lock.mkdir()
    with pytest.raises(OpError) as info:
        lockmod.acquire(str(lock), timeout=0.2)
    assert "unknown owner" in info.value.message
    old = time.time() - lockmod.OWNERLESS_GRACE - 1
    os.utime(lock, (old, old))
    warnings: list[str] = []
    lockmod.release(lockmod.acquire(str(lock), timeout=1, warnings=warnings))
    assert "no owner record" in warnings[0]


def test_breaker_with_an_old_observation_spares_a_newer_lock(paths: Paths) -> None:
    lock = str(paths[1])
    me = lockmod.host_identity()
    write_owner(paths[1], pid=_dead_pid())
    stale = lockmod.inspect(lock, time.time(), me)
    assert stale is not None and stale.stale_reason
    assert lockmod.break_stale(lock, stale, me, lockmod.OWNERLESS_GRACE, time.time)
    fresh = lockmod.acquire(lock, timeout=1)  # a live holder takes the lock again
    assert not lockmod.break_stale(lock, stale, me, lockmod.OWNERLESS_GRACE, time.time)
    assert Path(lock).exists() and lockmod.release(fresh) == []


def test_zero_timeout_still_takes_a_lock_freed_by_breaking_it(paths: Paths) -> None:
    write_owner(paths[1], pid=_dead_pid())
    warnings: list[str] = []
    lockmod.release(lockmod.acquire(str(paths[1]), timeout=0, warnings=warnings))
    assert len(warnings) == 1


def test_a_busy_guard_stops_breaking_and_an_abandoned_one_is_cleared(paths: Paths) -> None:
    lock = str(paths[1])
    me = lockmod.host_identity()
    write_owner(paths[1], pid=_dead_pid())
    stale = lockmod.inspect(lock, time.time(), me)
    assert stale is not None
    guard = Path(lock + ".breaking")
    guard.mkdir()
    assert not lockmod.break_stale(lock, stale, me, lockmod.OWNERLESS_GRACE, time.time)
    assert guard.exists() and Path(lock).exists()
    old = time.time() - lockmod.BREAK_GUARD_STALE - 1
    os.utime(guard, (old, old))
    assert not lockmod.break_stale(lock, stale, me, lockmod.OWNERLESS_GRACE, time.time)
    assert not guard.exists()
    assert lockmod.break_stale(lock, stale, me, lockmod.OWNERLESS_GRACE, time.time)


def test_release_leaves_a_lock_taken_over_by_someone_else(paths: Paths) -> None:
    handle = lockmod.acquire(str(paths[1]), timeout=1)
    os.rename(paths[1], paths[1].with_name("moved"))
    write_owner(paths[1], pid=os.getpid())
    (warning,) = lockmod.release(handle)
    assert "taken over" in warning and paths[1].exists()


def test_wait_uses_the_injected_clock_and_sleep(paths: Paths) -> None:
    write_owner(paths[1], host="login-elsewhere", pid=1)
    fake = {"t": 0.0}
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        fake["t"] += seconds

    start = time.monotonic()
    with pytest.raises(OpError):
        lockmod.acquire(str(paths[1]), timeout=30, monotonic=lambda: fake["t"], sleep=sleep)
    assert time.monotonic() - start < 5
    assert sum(slept) == pytest.approx(30) and max(slept) <= 0.05


def test_missing_parent_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(OpError) as info:
        lockmod.acquire(str(tmp_path / "no" / "lock"), timeout=1)
    assert info.value.type == "LockError"


def _dead_pid() -> int:
    """A pid that no process has (a child that already exited and was reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
