"""Plain-process management: launching detached daemons, pid records, stopping, waiting.

Daemons are launched so that they detach from the caller (their own daemon mode, or
``setsid --fork``) and write their own pid file. What ``up`` started is kept in a JSON
file of :class:`PidRecord` entries; a record counts as alive only while a process with
that pid exists, is not a zombie, has the recorded command name and the recorded start
time. ``down`` therefore never signals a process that merely reuses an old pid.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from dagster_slurm.backoff import PollBackoff

#: PATH given to every daemon and cluster command (independent of the caller's PATH).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_RECORDS_SCHEMA = 1


@dataclass(frozen=True)
class PidRecord:
    """A daemon that ``up`` started.

    ``pid`` is its process id, ``comm`` the kernel's command name (``/proc/PID/comm``),
    ``start_ticks`` its start time in clock ticks after boot (``/proc/PID/stat`` field
    22), ``digest`` a hash of the command line and configuration it was started with.
    """

    name: str
    pid: int
    comm: str
    start_ticks: int
    digest: str


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says about a process: command name, one-letter state, start ticks."""

    comm: str
    state: str
    start_ticks: int


def proc_info(pid: int) -> ProcInfo | None:
    """Read /proc/PID/stat; None when no such process exists."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    head, _, tail = raw.rpartition(")")
    comm = head.partition("(")[2]
    fields = tail.split()
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    return ProcInfo(comm=comm, state=fields[0], start_ticks=int(fields[19]))


def is_alive(record: PidRecord) -> bool:
    """True while the recorded process still runs (same pid, name and start time)."""
    info = proc_info(record.pid)
    if info is None or info.state in ("Z", "X"):
        return False
    return info.comm == record.comm and info.start_ticks == record.start_ticks


class RecordStore:
    """The JSON file of pid records, with an exclusive lock for ``up``/``down``."""

    def __init__(self, path: Path, lock_path: Path) -> None:
        self.path = path
        self.lock_path = lock_path

    def load(self) -> dict[str, PidRecord]:
        """All records by daemon name; empty when the file is missing or unreadable."""
        try:
            data = json.loads(self.path.read_text())
            return {name: PidRecord(**rec) for name, rec in data["daemons"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def save(self, records: Mapping[str, PidRecord]) -> None:
        """Replace the file atomically with ``records``."""
        data = {
            "schema_version": _RECORDS_SCHEMA,
            "daemons": {name: asdict(rec) for name, rec in records.items()},
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)

    def put(self, record: PidRecord) -> None:
        records = self.load()
        records[record.name] = record
        self.save(records)

    def remove(self, name: str) -> None:
        records = self.load()
        if records.pop(name, None) is not None:
            self.save(records)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock so two ``up``/``down`` runs never interleave."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def daemon_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A small, predictable environment for daemons and cluster commands."""
    env = {"PATH": SYSTEM_PATH, "LC_ALL": "C.UTF-8", "HOME": "/root"}
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    env.update(extra or {})
    return env


def run(
    argv: Sequence[str],
    env: Mapping[str, str],
    input_text: str | None = None,
    timeout: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    """Run a short command and capture its output (never raises on a non-zero exit)."""
    return subprocess.run(
        list(argv),
        env=dict(env),
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def launch(argv: Sequence[str], env: Mapping[str, str], output: Path) -> int:
    """Run a launcher that detaches the daemon and exits; return the launcher's exit code.

    stdout/stderr go to ``output`` (replaced at each launch) so that errors printed
    before the daemon opened its own log are not lost. The daemon starts in ``/``: a
    working directory inherited from the caller may not exist in a node's mount namespace
    (its own ``/tmp``), and slurmstepd then fails to return to it for every job step.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "wb") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.run(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            timeout=60,
            check=False,
        )
    return proc.returncode


def read_pid_file(path: Path) -> int | None:
    """The pid stored in ``path``, or None when the file is missing or not a number."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def wait_for(
    check: Callable[[], bool],
    timeout: float,
    interval: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Call ``check`` until it returns True or ``timeout`` seconds passed; return the last result."""
    deadline = clock() + timeout
    backoff = PollBackoff(initial=interval, maximum=max(interval, 0.5), factor=1.5)
    while True:
        if check():
            return True
        if clock() >= deadline:
            return False
        sleep(backoff.current)
        backoff.observe(False)


def record_from_pid_file(name: str, pid_file: Path, comm: str, digest: str) -> PidRecord | None:
    """A record for the live process named in ``pid_file`` if its command name is ``comm``."""
    pid = read_pid_file(pid_file)
    if pid is None:
        return None
    info = proc_info(pid)
    if info is None or info.comm != comm or info.state in ("Z", "X"):
        return None
    return PidRecord(name=name, pid=pid, comm=comm, start_ticks=info.start_ticks, digest=digest)


def stop(record: PidRecord, timeout: float = 15.0) -> bool:
    """Send TERM, wait up to ``timeout`` seconds, then KILL. Returns True once it is gone.

    Only the recorded process is signalled, and only while it still matches the record.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not is_alive(record):
            return True
        try:
            os.kill(record.pid, sig)
        except ProcessLookupError:
            return True
        if wait_for(lambda: not is_alive(record), wait):
            return True
    return not is_alive(record)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ssh_banner(host: str, port: int, timeout: float = 1.0) -> str:
    """First line an SSH server sends (``SSH-2.0-...``); empty when nothing answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(256).decode(errors="replace").strip()
    except OSError:
        return ""


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of ``path`` (empty when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
