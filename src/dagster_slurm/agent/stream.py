"""A small pool of long-lived agent processes (``--serve``), one request per line.

A request over a pooled stream costs one exchange on an open SSH channel and no interpreter
start on the login node. Guarantees:

* At most ``max_streams`` agent processes per client; callers beyond that wait for a free
  one (each stream holds one SSH channel while open).
* A stream whose request failed or timed out is discarded, never reused: its state is
  unknown. The error propagates; whether the request ran is unknown, as with one-shot execs.
* :meth:`AgentStreamPool.close` ends every stream; each agent process exits when its
  standard input closes, so none outlives the pool or the SSH connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from dagster_slurm.errors import RemoteProgramEnded, TransportError
from dagster_slurm.transport.base import Stream, Transport

log = logging.getLogger("dagster_slurm.agent")

#: Returned by :meth:`AgentStreamPool.request` when the program is not installed yet.
NOT_INSTALLED = object()


class AgentStreamPool:
    """Streams running ``argv`` (the agent in serve mode), shared by the client's callers."""

    def __init__(
        self, transport: Transport, argv: Sequence[str], *, not_installed_exit: int, max_streams: int = 2
    ) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, got {max_streams}")
        self.transport = transport
        self.argv = list(argv)
        self.not_installed_exit = not_installed_exit
        self.max_streams = max_streams
        self._cond = threading.Condition()
        self._idle: list[Stream] = []
        self._open = 0

    def _take(self, timeout: float) -> Stream:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._idle and self._open >= self.max_streams:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._cond.wait(remaining):
                    raise TransportError(
                        f"no agent stream became free within {timeout:.0f} s "
                        f"({self.max_streams} busy)"
                    )
            if self._idle:
                return self._idle.pop()
            self._open += 1
        try:
            return self.transport.open_stream(self.argv)
        except BaseException:
            self._discard(None)
            raise

    def _give_back(self, stream: Stream) -> None:
        with self._cond:
            self._idle.append(stream)
            self._cond.notify()

    def _discard(self, stream: Stream | None) -> None:
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:  # noqa: BLE001 - logged; the stream is discarded either way
                log.debug("closing a broken agent stream failed (%s: %s); it is dropped",
                          type(exc).__name__, exc)
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def request(self, line: bytes, timeout: float) -> bytes | object:
        """Send one request line; return the response line, or :data:`NOT_INSTALLED`.

        An agent process that had ended before the request reached it (ended by the login
        node while idle, crashed) is replaced and the request sent to a new one, once,
        with a warning: the request reached nobody, so this is safe. One that ends while
        handling the request is an error saying that whether the request ran is unknown.
        """
        for attempt in (1, 2):
            stream = self._take(timeout)
            try:
                stream.send(line)
            except RemoteProgramEnded:
                code, stderr = self._ended(stream)
                if code == self.not_installed_exit:
                    return NOT_INSTALLED
                if attempt == 2:
                    raise TransportError(
                        "the cluster-side agent (the program dagster-slurm runs on the login "
                        f"node) ended twice in a row before it could take a request "
                        f"({exit_text(code)}); the SSH connection is up. Check that its "
                        "python runs on the login node and that nothing there ends "
                        f"long-running processes. Its last error output: {stderr[-2000:]}"
                    ) from None
                log.warning(
                    "the cluster-side agent process on the login node had ended (%s) before "
                    "a request reached it; the SSH connection is up, so a new agent process "
                    "was started and the request sent to it", exit_text(code),
                )
                self._drop_ended()
                continue
            except TransportError:
                # A stream that exits at once (not installed) can close its input before we write.
                if self._discard_failed(stream):
                    return NOT_INSTALLED
                raise
            except BaseException:
                self._discard(stream)
                raise
            return self._answer(stream, timeout)
        raise AssertionError("unreachable")

    def _answer(self, stream: Stream, timeout: float) -> bytes | object:
        """The answer to the request just sent on ``stream`` (see :meth:`request`)."""
        try:
            answer = stream.readline(timeout)
        except TransportError:
            if self._discard_failed(stream):
                return NOT_INSTALLED
            raise
        except BaseException:
            self._discard(stream)
            raise
        if answer:
            self._give_back(stream)
            return answer
        # The process ended without answering: not installed, or it failed or was killed.
        code, stderr = self._ended(stream)
        if code == self.not_installed_exit:
            return NOT_INSTALLED
        raise TransportError(
            "the cluster-side agent process on the login node ended while handling a request "
            f"({exit_text(code)}); the SSH connection is up. Whether the request ran is "
            "unknown; the next request starts a new agent process. Its last error output: "
            f"{stderr[-2000:]}"
        )

    def _discard_failed(self, stream: Stream) -> bool:
        """Discard ``stream`` after a send or read on it failed; True when its process
        exited with the status that means the program is not installed yet."""
        installing = _installing(stream, self.not_installed_exit)
        self._discard(stream)
        return installing

    def _drop_ended(self) -> None:
        """Discard the idle streams whose process has ended (so that a retry gets a live one)."""
        with self._cond:
            ended = [stream for stream in self._idle if stream.exit_code() is not None]
            self._idle = [stream for stream in self._idle if stream not in ended]
        for stream in ended:
            self._discard(stream)

    def _ended(self, stream: Stream) -> tuple[int | None, str]:
        """The exit status and error output of ``stream``'s ended process; discards it."""
        code = _wait_exit(stream)
        stderr = stream.stderr_tail().strip()
        self._discard(stream)
        return code, stderr

    def close(self) -> None:
        """End every idle stream (busy ones end when their request returns and is discarded)."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for stream in idle:
            try:
                stream.close()
            except Exception as exc:  # noqa: BLE001 - logged; the pool is closing anyway
                log.debug("closing an idle agent stream failed (%s: %s); it is dropped",
                          type(exc).__name__, exc)


def exit_text(code: int | None) -> str:
    """How a process ended, for messages: ``exit status 1``, ``killed by signal 9``."""
    if code is None:
        return "its exit status is not known yet"
    if code == -1:  # paramiko's value for a command that sent no exit status (a signal)
        return "no exit status, as when killed by a signal"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


def _installing(stream: Stream, not_installed_exit: int) -> bool:
    """Whether ``stream``'s process exited (within half a second) with the status that
    means the program is not installed yet."""
    return stream.exit_code() == not_installed_exit or _wait_exit(stream, 0.5) == not_installed_exit


def _wait_exit(stream: Stream, seconds: float = 5.0) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        code = stream.exit_code()
        if code is not None:
            return code
        time.sleep(0.01)
    return None
