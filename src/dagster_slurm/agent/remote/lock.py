"""A lock on a shared filesystem: a directory created with ``mkdir``, with an owner record.

Stdlib only, Python 3.8+; runs on the login node inside the cluster-side agent.

Taking the lock creates the directory (``mkdir`` is atomic, also on NFS) and then writes
``owner.json`` inside it: host name, pid, the process start time (field 22 of
``/proc/<pid>/stat``), boot id, pid namespace, ``acquired_at``, a lease (``lease`` seconds,
``expires_at``), a ``purpose`` and a random ``token``. Waiting polls with short, jittered
sleeps until the caller's timeout.

Guarantees:

* Mutual exclusion between live holders of one host: a holder whose process this host can
  check (same host name, boot id and pid namespace) and that is alive is never broken,
  whatever its age. When the wait times out, the error names the lock path and the owner
  (pid, host, age, purpose).
* A lock left by a dead process of the same host is broken when its pid is gone, a zombie,
  or now belongs to another process (start time differs).
* A lock whose owner ran where this process cannot see it (another login node behind the
  same name, another host, another pid namespace: its pid means nothing here) is judged by
  its lease alone: it is broken once ``expires_at`` has passed, never by a pid. A holder
  that needs the lock longer than its lease renews it (:func:`renew`).
* A lock directory without an owner record that is older than ``ownerless_grace`` seconds
  (the holder died between ``mkdir`` and writing its record) is stale too. Each break is
  reported as a warning naming the dead owner.
* Breaking is exclusive and re-checked: a breaker first takes a ``<lock>.breaking`` guard
  directory, re-reads the lock (same owner token) and then renames the lock directory to a
  unique name before deleting it, so two breakers never both win and a breaker acting on an
  old observation never breaks a newer lock.
* Release removes the lock only if it is still the directory this holder created.

Non-guarantees:

* A holder on another host that is still alive past its lease (stalled longer than the lease,
  which is many times the few milliseconds a transaction holds the lock) loses it. Leases
  compare wall clocks of two hosts: login nodes are assumed to agree within well under the
  lease. An owner record without a lease (written by an older agent) on another host is
  never broken: remove the directory by hand once that process is gone; the timeout message
  names it.
* No fairness: waiters are not served in arrival order.
* A holder that stalls longer than ``ownerless_grace`` between ``mkdir`` and writing its owner
  record may lose the lock; a breaker that stalls longer than ``BREAK_GUARD_STALE`` inside
  the guard may have its guard removed. Both windows are microseconds long in practice.
* Ownerless age uses the directory's mtime, which on NFS is set by the server's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from .common import OpError

OWNER_FILE = "owner.json"
#: Seconds a lock directory may exist without an owner record before it counts as stale.
OWNERLESS_GRACE = 5.0
#: Seconds a holder may keep the lock before a process on another host may break it (a
#: transaction holds it for milliseconds; the wait for a lock is 30 s by default).
DEFAULT_LEASE = 20.0
#: Seconds after which an abandoned ``.breaking`` guard directory is removed.
BREAK_GUARD_STALE = 30.0
_MAX_POLL = 0.05


class LockHandle:
    """A held lock: ``path``, the ``owner`` record written, and the directory's identity."""

    def __init__(self, path: str, owner: dict, dev_ino: tuple) -> None:
        self.path = path
        self.owner = owner
        self.dev_ino = dev_ino


class LockView:
    """What a waiter saw: the owner record (or None), the lock's age and why it is stale."""

    def __init__(
        self, owner: dict | None, age: float, dev_ino: tuple, stale_reason: str | None
    ) -> None:
        self.owner = owner
        self.age = age
        self.dev_ino = dev_ino
        self.stale_reason = stale_reason


def host_identity() -> dict:
    """This process's host: name, boot id and pid namespace (None where unknown)."""
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid_ns": _pid_namespace()}


def process_stat(pid: int) -> tuple | None:
    """``(state, start_time)`` of ``pid`` from ``/proc/<pid>/stat``, or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    if len(fields) < 20:
        return None
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    return fields[0], int(fields[19]) if fields[19].isdigit() else None


def owner_record(purpose: str, now: float, lease: float = DEFAULT_LEASE) -> dict:
    """The owner record of the calling process, with a lease of ``lease`` seconds."""
    pid = os.getpid()
    stat = process_stat(pid)
    record = host_identity()
    record.update(
        pid=pid,
        start_time=stat[1] if stat else None,
        acquired_at=now,
        lease=lease,
        expires_at=now + lease,
        purpose=purpose,
        token=os.urandom(8).hex(),
    )
    return record


def describe_owner(owner: dict | None, now: float) -> str:
    """Human description of an owner record, e.g. ``pid 42 on host login1, held for 3.0 s``."""
    if not owner:
        return "an unknown owner (no owner record)"
    text = f"pid {owner.get('pid')} on host {owner.get('host')}"
    acquired = owner.get("acquired_at")
    if isinstance(acquired, (int, float)):
        text += f", held for {now - acquired:.1f} s"
    if owner.get("purpose"):
        text += f", purpose {owner['purpose']!r}"
    return text


def stale_reason(
    owner: dict | None, age: float, me: dict, grace: float, now: float | None = None
) -> str | None:
    """Why a lock with this owner record (and directory age) is stale at ``now`` (this
    host's wall clock; None: leases are not judged), or None if it is not."""
    if owner is None:
        return f"no owner record for {age:.1f} s" if age > grace else None
    if owner.get("host") == me["host"]:
        boot_id = owner.get("boot_id")
        if boot_id and me["boot_id"] and boot_id != me["boot_id"]:
            return "the host has rebooted since the lock was taken"
        pid_ns = owner.get("pid_ns")
        if not (pid_ns and me["pid_ns"] and pid_ns != me["pid_ns"]):
            return _dead_process_reason(owner["pid"], owner.get("start_time"))
    return lease_expired_reason(owner, now)


def lease_expired_reason(owner: dict, now: float | None) -> str | None:
    """Why the lease of an owner whose process cannot be checked from here has run out at
    ``now``, or None (not expired, no lease recorded, or ``now`` None)."""
    expires_at = owner.get("expires_at")
    if now is None or isinstance(expires_at, bool) or not isinstance(expires_at, (int, float)):
        return None
    if now < expires_at:
        return None
    return (f"its lease expired {now - expires_at:.1f} s ago (held from host "
            f"{owner.get('host')}, whose processes cannot be checked from here)")


def inspect(path: str, now: float, me: dict, grace: float = OWNERLESS_GRACE) -> LockView | None:
    """The current state of the lock at ``path``, or None if nobody holds it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    owner = _read_owner(path)
    age = now - st.st_mtime
    return LockView(owner, age, (st.st_dev, st.st_ino), stale_reason(owner, age, me, grace, now))


def acquire(
    path: str,
    timeout: float,
    purpose: str = "",
    warnings: list | None = None,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    ownerless_grace: float = OWNERLESS_GRACE,
    lease: float = DEFAULT_LEASE,
) -> LockHandle:
    """Take the lock at ``path``, waiting up to ``timeout`` seconds, with a lease of
    ``lease`` seconds (how long a process on another host waits before it may break it).

    Stale locks are broken on the way (see the module docstring); a message per break is
    appended to ``warnings``. Raises ``OpError("LockTimeout")`` naming the lock and its owner,
    or ``OpError("LockError")`` when the lock's parent directory does not exist.
    """
    me = host_identity()
    deadline = monotonic() + timeout
    delay = 0.002
    last_try = False
    while True:
        handle = _try_create(path, purpose, clock(), lease)
        if handle is not None:
            return handle
        view = inspect(path, clock(), me, ownerless_grace)
        freed = view is None
        if view is not None and view.stale_reason:
            freed = break_stale(path, view, me, ownerless_grace, clock)
            if freed and warnings is not None:
                warnings.append(
                    f"broke stale lock {path} of {describe_owner(view.owner, clock())}: "
                    f"{view.stale_reason}"
                )
        remaining = deadline - monotonic()
        if remaining <= 0:
            if freed and not last_try:
                last_try = True  # the lock was just freed: one more attempt
                continue
            raise _timeout_error(path, timeout, view.owner if view else None, me, clock())
        if not freed:
            sleep(min(remaining, delay * random.uniform(0.5, 1.0)))
            delay = min(delay * 1.5, _MAX_POLL)


def release(handle: LockHandle) -> list:
    """Release a held lock; returns warnings (empty when all went as expected)."""
    path = handle.path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return [f"lock {path} was already gone when it was released"]
    if (st.st_dev, st.st_ino) != handle.dev_ino:
        return [f"lock {path} was taken over by another process before release; left alone"]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, OWNER_FILE))
    try:
        os.rmdir(path)
    except OSError as exc:
        return [f"could not remove lock {path}: {exc}"]
    return []


@contextlib.contextmanager
def locked(
    path: str, timeout: float, purpose: str = "", warnings: list | None = None, **options: Any
) -> Iterator[LockHandle]:
    """Hold the lock for the ``with`` block; release warnings are appended to ``warnings``."""
    handle = acquire(path, timeout, purpose, warnings, **options)
    try:
        yield handle
    finally:
        released = release(handle)
        if warnings is not None:
            warnings.extend(released)


def _timeout_error(path: str, timeout: float, owner: dict | None, me: dict, now: float) -> OpError:
    message = (
        f"could not take lock {path} within {timeout:g} s: "
        f"it is held by {describe_owner(owner, now)}"
    )
    if owner and owner.get("host") != me["host"]:
        if isinstance(owner.get("expires_at"), (int, float)):
            message += (f"; held from another host, it is broken once its lease expires "
                        f"(in {owner['expires_at'] - now:.1f} s)")
        else:
            message += (
                "; a lock held from another host without a lease is never broken "
                "automatically, remove the directory once that process is gone"
            )
    return OpError("LockTimeout", message, lock=path, owner=owner)


def renew(handle: LockHandle, now: float, lease: float | None = None) -> bool:
    """Extend a held lock's lease to ``now + lease`` (default: its lease); False when the
    lock is no longer the directory this holder created (broken meanwhile)."""
    try:
        fd = os.open(handle.path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != handle.dev_ino:
            return False
        seconds = lease if lease is not None else handle.owner.get("lease", DEFAULT_LEASE)
        owner = dict(handle.owner, lease=seconds, expires_at=now + seconds)
        _write_owner(fd, owner)
        handle.owner = owner
        return True
    finally:
        os.close(fd)


def _try_create(path: str, purpose: str, now: float, lease: float) -> LockHandle | None:
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return None
    except FileNotFoundError:
        raise OpError(
            "LockError", f"cannot create lock {path}: its parent directory does not exist"
        ) from None
    owner = owner_record(purpose, now, lease)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        _write_owner(fd, owner)
    finally:
        os.close(fd)
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return None
    if (current.st_dev, current.st_ino) != (st.st_dev, st.st_ino):
        return None  # broken as ownerless while this process stalled
    return LockHandle(path, owner, (st.st_dev, st.st_ino))


def _write_owner(dir_fd: int, owner: dict) -> None:
    tmp = f".{OWNER_FILE}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as f:
        json.dump(owner, f)
    os.replace(tmp, OWNER_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _read_owner(path: str) -> dict | None:
    try:
        with open(os.path.join(path, OWNER_FILE), "rb") as f:
            owner = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    pid = owner.get("pid") if isinstance(owner, dict) else None
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    if not isinstance(owner.get("host"), str):
        return None
    return owner


def _dead_process_reason(pid: int, start_time: Any) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"process {pid} is no longer running"
    except PermissionError:
        pass  # exists, belongs to another user
    stat = process_stat(pid)
    if stat is None:
        return None  # cannot tell: assume alive
    state, current_start = stat
    if state in ("Z", "X"):
        return f"process {pid} has exited"
    if isinstance(start_time, int) and current_start is not None and current_start != start_time:
        return f"pid {pid} now belongs to another process (start time changed)"
    return None


def break_stale(path: str, view: LockView, me: dict, grace: float, clock: Callable) -> bool:
    """Break the lock at ``path`` that ``view`` (from :func:`inspect`) saw stale; True when
    this call removed it. Exclusive and re-checked (see the module docstring): under the
    ``<path>.breaking`` guard the lock is read again and broken only if it is still the
    directory and owner ``view`` saw, and still stale (``me``, ``grace``: as for
    :func:`inspect`). A guard that exists already belongs to another breaker (False); one
    older than :data:`BREAK_GUARD_STALE` was abandoned and is removed (False too: the next
    call may break)."""
    guard = path + ".breaking"
    try:
        os.mkdir(guard)
    except FileExistsError:
        _clear_abandoned_guard(guard, clock())
        return False
    except OSError:
        return False
    try:
        again = inspect(path, clock(), me, grace)
        if again is None or again.dev_ino != view.dev_ino or not again.stale_reason:
            return False
        if (again.owner or {}).get("token") != (view.owner or {}).get("token"):
            return False
        grave = f"{path}.stale.{os.getpid()}.{os.urandom(4).hex()}"
        try:
            os.rename(path, grave)
        except OSError:  # gone meanwhile, or not ours to move (permissions)
            return False
        shutil.rmtree(grave, ignore_errors=True)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(guard)


def _clear_abandoned_guard(guard: str, now: float) -> None:
    try:
        if now - os.stat(guard).st_mtime > BREAK_GUARD_STALE:
            os.rmdir(guard)
    except OSError:
        pass


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
