"""A :class:`~dagster_slurm.transport.base.Transport` that runs commands as local subprocesses.

Used by local mode and by unit tests of code that talks to the cluster-side agent.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Mapping, Sequence

from dagster_slurm.errors import CommandTimeout, RemoteProgramEnded, TransportError
from dagster_slurm.transport.base import CommandResult, LineBuffer, TransportStats, render_command


class LocalTransport:
    """Runs each argv with :func:`subprocess.run` (no shell) on this machine."""

    def __init__(self, default_timeout: float = 300.0) -> None:
        self.default_timeout = default_timeout
        self.stats = TransportStats()

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        command = render_command(argv, env)
        limit = self.default_timeout if timeout is None else timeout
        full_env = None if not env else {**os.environ, **env}
        start = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=limit,
                env=full_env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(f"{command!r} did not finish within {limit:.0f} s") from exc
        except OSError as exc:
            raise TransportError(f"could not run {command!r}: {exc}") from exc
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        self.stats.record(argv[0], len(stdin or b""), len(proc.stdout) + len(proc.stderr))
        return CommandResult(command, proc.returncode, out, err, time.monotonic() - start)

    def open_stream(self, argv: Sequence[str]) -> LocalStream:
        """Start ``argv`` with pipes as a long-lived stream."""
        return LocalStream(argv, self.stats)

    def close(self) -> None:
        """Nothing to release."""


class LocalStream:
    """A :class:`~dagster_slurm.transport.base.Stream` over a local subprocess's pipes."""

    def __init__(self, argv: Sequence[str], stats: TransportStats) -> None:
        self._stats = stats
        self._argv0 = argv[0]
        try:
            self._proc = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise TransportError(f"could not start {render_command(argv)!r}: {exc}") from exc
        self._lines = LineBuffer()
        self._err = bytearray()
        self._pending = 0

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except OSError as exc:
            if self._proc.poll() is not None:
                raise RemoteProgramEnded(
                    f"{self._argv0!r} had ended when a request was written to it; the request "
                    "reached nobody"
                ) from exc
            raise TransportError(f"stream {self._argv0!r} closed: {exc}") from exc
        self._pending = len(data)

    def readline(self, timeout: float) -> bytes:
        assert self._proc.stdout is not None and self._proc.stderr is not None
        deadline = time.monotonic() + timeout
        out_fd, err_fd = self._proc.stdout.fileno(), self._proc.stderr.fileno()
        open_fds = [out_fd, err_fd]
        while True:
            line = self._lines.pop_line()
            if line is not None:
                self._stats.record(self._argv0, self._pending, len(line))
                return line
            if out_fd not in open_fds:
                return b""
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"no answer from {self._argv0!r} within {timeout:.0f} s")
            ready, _, _ = select.select(open_fds, [], [], remaining)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.remove(fd)
                elif fd == out_fd:
                    self._lines.feed(chunk)
                else:
                    self._err = (self._err + chunk)[-8192:]

    def stderr_tail(self) -> str:
        return self._err.decode("utf-8", "replace")

    def exit_code(self) -> int | None:
        return self._proc.poll()

    def close(self) -> None:
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
