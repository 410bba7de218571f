"""The thin seam between the library and a shell on the cluster.

A :class:`Transport` runs one argv (quoted once, here) and returns a
:class:`CommandResult`. Everything above it — the cluster-side agent client, the scheduler
layer — is written against this protocol, so the same code runs over SSH
(:mod:`dagster_slurm.transport.ssh`) or as local subprocesses
(:mod:`dagster_slurm.transport.local`).
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one command on the cluster.

    ``command`` is the exact shell text that was sent; ``exit_code`` is the remote exit
    status; ``stdout``/``stderr`` are decoded as UTF-8 (invalid bytes replaced);
    ``duration_s`` is the wall time of the round trip seen by the caller.
    """

    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0


@dataclass
class TransportStats:
    """Counters a transport keeps, used by benchmarks and tests.

    ``round_trips`` counts command executions (one per :meth:`Transport.run`),
    ``connects`` counts logins (new SSH connections), ``commands`` keeps the argv[0]
    of every command run, in order.
    """

    round_trips: int = 0
    connects: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    commands: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, argv0: str, sent: int, received: int) -> None:
        with self._lock:
            self.round_trips += 1
            self.bytes_sent += sent
            self.bytes_received += received
            self.commands.append(argv0)

    def reset(self) -> None:
        with self._lock:
            self.round_trips = 0
            self.connects = 0
            self.bytes_sent = 0
            self.bytes_received = 0
            self.commands.clear()


class Stream(Protocol):
    """A long-lived command with line-oriented standard input and output.

    Used for the cluster-side agent's serve mode: one line written, one line read back.
    """

    def send(self, data: bytes) -> None:
        """Write ``data`` to the command's standard input. Raises
        :class:`~dagster_slurm.errors.RemoteProgramEnded` when the command had ended (the
        data reached nobody) and :class:`~dagster_slurm.errors.TransportError` when the
        link fails."""
        ...

    def readline(self, timeout: float) -> bytes:
        """The next line of standard output (with its newline); ``b""`` once it ended.

        Raises :class:`~dagster_slurm.errors.CommandTimeout` when no full line arrives within
        ``timeout`` seconds and :class:`~dagster_slurm.errors.TransportError` when the link
        fails.
        """
        ...

    def stderr_tail(self) -> str:
        """The last few KiB the command wrote to standard error (for error messages)."""
        ...

    def exit_code(self) -> int | None:
        """The command's exit status once it ended, else None."""
        ...

    def close(self) -> None:
        """Close standard input and release the stream; the command sees EOF."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Runs commands on the cluster's login node (or locally)."""

    stats: TransportStats

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``argv`` (each element passed literally, never interpreted by a shell).

        ``stdin`` is written to the command's standard input, which is then closed.
        ``timeout`` bounds the whole call in seconds (None: the transport's default).
        ``env`` adds environment variables for this command only.
        Raises :class:`~dagster_slurm.errors.TransportError` when the command could not be
        run or did not finish in time; a non-zero exit is *not* an error here.
        """
        ...

    def open_stream(self, argv: Sequence[str]) -> Stream:
        """Start ``argv`` as a long-lived :class:`Stream` (it holds one channel while open)."""
        ...

    def close(self) -> None:
        """Release connections; the transport may be used again afterwards (it reconnects)."""
        ...


class LineBuffer:
    """Accumulates bytes and hands out complete lines (a helper for Stream implementations)."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> None:
        self._data += data

    def pop_line(self) -> bytes | None:
        """The first complete line including its newline, or None if there is none yet."""
        index = self._data.find(b"\n")
        if index < 0:
            return None
        line = bytes(self._data[: index + 1])
        del self._data[: index + 1]
        return line


def render_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Quote ``argv`` (and optional ``env`` assignments) into one POSIX shell command line.

    Each element is quoted with :func:`shlex.quote`, so metacharacters in values reach the
    program literally. Environment names must be valid shell identifiers.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    prefix = ""
    if env:
        parts = []
        for name, value in env.items():
            if not name.isidentifier():
                raise ValueError(f"environment variable name {name!r} is not a valid identifier")
            parts.append(f"{name}={shlex.quote(value)}")
        prefix = "env " + " ".join(parts) + " "
    return prefix + shlex.join(argv)
