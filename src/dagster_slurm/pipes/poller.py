"""The polling behind :class:`~dagster_slurm.pipes.reader.PipesTailMessageReader`.

:class:`TailPoller` holds the state of one read block: each file's read position and
unfinished line (:class:`~dagster_slurm.pipes.tailing.TailedFile`), the counters
(:class:`ReaderStats`), the last stdout and stderr lines, and the pacing of the polls. Each
poll reads all files with one ``source.read``; a sound answer's chunks are applied, their
messages handed to Dagster's handler and their log lines to the sinks. :meth:`TailPoller.run`
polls until stopped (in the reader's thread), :meth:`TailPoller.drain` runs the final drain.
The guarantees this keeps are listed in :mod:`dagster_slurm.pipes.reader`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from dagster import PipesMessageHandler

from dagster_slurm.agent.results import TailChunk, TailRequest
from dagster_slurm.errors import AuthenticationFailed
from dagster_slurm.pipes.sources import FileSource
from dagster_slurm.pipes.tailing import TailedFile, Throttle, check_answer

__all__ = ["LineSink", "PollSettings", "ReaderStats", "TailPoller"]

log = logging.getLogger("dagster_slurm.pipes")

LineSink = Callable[[str], None]
"""Receives each complete stdout or stderr line (no newline)."""

#: Polls at ``poll_interval`` while no file exists yet, before the wait starts doubling up to
#: ``idle_interval`` (a job that starts at once is seen at once; a queued one is spared).
IDLE_POLLS_AT_POLL_INTERVAL = 4
#: Pause between polls of the final drain while waiting for the closed message or a file.
DRAIN_POLL_INTERVAL = 0.1
#: Longest stdout/stderr line kept whole; a longer run of bytes without newline is cut.
MAX_LOG_LINE_BYTES = 1024 * 1024
#: Invalid message lines logged one by one before the reader only counts them.
MAX_INVALID_LINE_WARNINGS = 10


@dataclass
class ReaderStats:
    """Counters of one :meth:`~dagster_slurm.pipes.reader.PipesTailMessageReader.read_messages`
    block (for benchmarks)."""

    polls: int = 0
    """Calls of ``source.read`` (round trips), failed ones included."""
    drain_polls: int = 0
    """Of these, the calls made by the final drain."""
    failed_polls: int = 0
    """Polls that raised or returned an unusable answer (retried with the same offsets)."""
    messages: int = 0
    """Messages handed to Dagster's handler."""
    message_bytes: int = 0
    """Bytes of the messages file consumed (delivered and skipped lines)."""
    bytes_read: int = 0
    """Bytes received from all three files."""
    stdout_lines: int = 0
    stderr_lines: int = 0
    invalid_lines: int = 0
    """Lines of the messages file skipped because they were not JSON messages."""


@dataclass(frozen=True)
class _PollOutcome:
    ok: bool
    got_data: bool = False
    behind: bool = False
    all_eof: bool = False


class PollSettings(Protocol):
    """What a :class:`TailPoller` reads and how often: the reader's settings (see
    :class:`~dagster_slurm.pipes.reader.PipesTailMessageReader`). The poller reads them at
    each use (the paths at :meth:`TailPoller.reset`), so a setting changed on the reader
    applies from then on."""

    source: FileSource
    messages_path: str
    stdout_path: str | None
    stderr_path: str | None
    poll_interval: float
    idle_interval: float
    max_bytes_per_file: int
    drain_timeout: float
    closed_grace: float
    warning_interval: float
    max_retry_interval: float


class TailPoller:
    """Polls the files of ``settings`` and delivers what they hold (see the module docstring).

    Args:
        settings: The files, the source and the intervals.
        sinks: Called with each complete stdout (``"stdout"``) and stderr (``"stderr"``) line.
        tail_lines: How many last lines of stdout/stderr to keep for :meth:`tail`.
        clock, sleep: Time functions.
        label: Names the poller's owner in the framework exceptions it reports to Dagster.

    ``files_seen`` says whether a poll of the current block found one of the files (until
    then :meth:`next_wait` paces the polls for a queued job).
    """

    def __init__(
        self,
        settings: PollSettings,
        sinks: Mapping[str, LineSink],
        *,
        tail_lines: int,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        label: str,
    ) -> None:
        self.settings = settings
        self._sinks = dict(sinks)
        self._tails: dict[str, deque[str]] = {
            "stdout": deque(maxlen=tail_lines),
            "stderr": deque(maxlen=tail_lines),
        }
        self._clock = clock
        self._sleep = sleep
        self._label = label
        self.reset()

    @property
    def stats(self) -> ReaderStats:
        """Counters of the current (or last) block."""
        return self._stats

    @property
    def last_poll_error(self) -> Exception | None:
        """Why the latest poll failed; ``None`` when it succeeded (or none ran yet)."""
        return self._last_poll_error

    @property
    def received_closed(self) -> bool:
        """Whether the payload's ``closed`` message has been delivered."""
        return self._seen_closed

    def tail(self, name: str, lines: int | None = None) -> str:
        """The last lines read from ``name`` (``"stdout"`` or ``"stderr"``), newline-separated."""
        items = list(self._tails[name])
        if lines is not None:
            items = items[-lines:] if lines > 0 else []
        return "\n".join(items)

    def reset(self) -> None:
        """Start a new block: every file from its start, counters and tails empty."""
        settings = self.settings
        self._streams = [TailedFile("messages", settings.messages_path)]
        if settings.stdout_path is not None:
            self._streams.append(TailedFile("stdout", settings.stdout_path, MAX_LOG_LINE_BYTES))
        if settings.stderr_path is not None:
            self._streams.append(TailedFile("stderr", settings.stderr_path, MAX_LOG_LINE_BYTES))
        self._stats = ReaderStats()
        self._last_poll_error: Exception | None = None
        self._failures_in_a_row = 0
        self._poll_warnings = Throttle(settings.warning_interval, self._clock)
        self._seen_opened = False
        self._seen_closed = False
        self._stopping = False
        self._wakeup = threading.Event()
        self.files_seen = False
        self._idle_polls = 0
        for tail in self._tails.values():
            tail.clear()

    # -- polling -----------------------------------------------------------------------------

    def run(self, handler: PipesMessageHandler) -> None:
        """Poll until :meth:`stop`: at once while a file is behind, else after
        :meth:`next_wait` (or when woken). An exception ends the loop; it is logged and
        reported to Dagster, and the final drain retries."""
        try:
            while not self._stopping:
                started = self._clock()
                outcome = self._poll(handler)
                if outcome.behind:
                    continue
                wait = self.next_wait()
                if outcome.got_data and not self._failures_in_a_row:  # a backlog is likely
                    wait -= self._clock() - started
                if wait > 0:
                    self._wakeup.wait(wait)
                self._wakeup.clear()
        except Exception:
            log.exception("the Pipes message reader thread failed; the final drain will retry")
            handler.report_pipes_framework_exception(
                f"{self._label} reader thread", sys.exc_info()
            )

    def wake(self) -> None:
        """Poll now instead of at the end of the current wait (e.g. when the job starts)."""
        self._wakeup.set()

    def stop(self) -> None:
        """End :meth:`run` after its current poll, without waiting for the next one."""
        self._stopping = True
        self._wakeup.set()

    def next_wait(self) -> float:
        """Seconds until the next poll: ``poll_interval`` once a file was seen, doubling up
        to ``idle_interval`` before; after failures a backoff up to ``max_retry_interval``."""
        settings = self.settings
        if not self._failures_in_a_row:
            if self.files_seen:
                return settings.poll_interval
            self._idle_polls += 1
            doublings = max(0, self._idle_polls - IDLE_POLLS_AT_POLL_INTERVAL)
            return min(settings.idle_interval, settings.poll_interval * 2 ** min(doublings, 16))
        backoff = settings.poll_interval * 2 ** min(self._failures_in_a_row - 1, 16)
        return min(max(backoff, settings.poll_interval), settings.max_retry_interval)

    def _poll(self, handler: PipesMessageHandler) -> _PollOutcome:
        """One ``source.read`` for all files; applies the chunks only if all of them are sound."""
        size = self.settings.max_bytes_per_file
        requests = [TailRequest(s.path, s.offset, size) for s in self._streams]
        self._stats.polls += 1
        try:
            chunks = self.settings.source.read(requests)
            check_answer(requests, chunks)
        except Exception as exc:
            self._poll_failed(exc)
            return _PollOutcome(ok=False)
        self._last_poll_error = None
        self._failures_in_a_row = 0
        for stream, chunk in zip(self._streams, chunks, strict=True):
            self._apply(stream, chunk, handler)
        return _PollOutcome(
            ok=not any(c.error for c in chunks),
            got_data=any(c.data for c in chunks),
            behind=any(c.truncated or not (c.eof or c.error) for c in chunks),
            all_eof=all(s.complete for s in self._streams),
        )

    def _poll_failed(self, exc: Exception) -> None:
        self._stats.failed_polls += 1
        self._failures_in_a_row += 1
        self._last_poll_error = exc
        if self._poll_warnings.ready():
            suppressed = self._poll_warnings.take_suppressed()
            more = f" ({suppressed} more failed polls since the last warning)" if suppressed else ""
            log.warning(
                "reading the Pipes files through %r failed, retrying from the same offsets: "
                "%s: %s%s",
                self.settings.source,
                type(exc).__name__,
                exc,
                more,
            )

    def _apply(self, stream: TailedFile, chunk: TailChunk, handler: PipesMessageHandler) -> None:
        stream.size = chunk.size
        self.files_seen = self.files_seen or chunk.exists
        stream.complete = chunk.eof and not chunk.error
        if chunk.error:
            self._last_poll_error = OSError(f"{stream.path}: {chunk.error}")
            if self._poll_warnings.ready():
                log.warning("could not read %s: %s; retrying", stream.path, chunk.error)
            return
        if chunk.truncated:
            log.warning(
                "%s shrank to %s bytes below the read offset %d; reading it again from the start",
                stream.path,
                chunk.size,
                stream.offset,
            )
            stream.restart()
            return
        self._stats.bytes_read += len(chunk.data)
        for line in stream.feed(chunk.data):
            self._deliver(stream, line, handler)
        stream.offset = chunk.offset

    # -- lines -------------------------------------------------------------------------------

    def _deliver(self, stream: TailedFile, line: bytes, handler: PipesMessageHandler) -> None:
        stream.lines += 1
        if stream.name == "messages":
            self._stats.message_bytes += len(line) + 1
            self._deliver_message(line, stream.lines, handler)
            return
        text = line.decode("utf-8", "replace").removesuffix("\r")
        self._tails[stream.name].append(text)
        if stream.name == "stdout":
            self._stats.stdout_lines += 1
        else:
            self._stats.stderr_lines += 1
        try:
            self._sinks[stream.name](text)
        except Exception:
            log.exception("the %s sink failed on line %d", stream.name, stream.lines)

    def _deliver_message(self, line: bytes, number: int, handler: PipesMessageHandler) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError as exc:
            self._invalid_line(number, f"not JSON ({exc})")
            return
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            self._invalid_line(number, "not a Pipes message (no 'method')")
            return
        self._stats.messages += 1
        method = message["method"]
        self._seen_opened = self._seen_opened or method == "opened"
        self._seen_closed = self._seen_closed or method == "closed"
        try:
            handler.handle_message(message)
        except Exception:
            log.exception("handling Pipes message %d (%s) failed", number, method)
            handler.report_pipes_framework_exception(
                f"{self._label} handling message {number} ({method})", sys.exc_info()
            )

    def _invalid_line(self, number: int, problem: str) -> None:
        self._stats.invalid_lines += 1
        if self._stats.invalid_lines <= MAX_INVALID_LINE_WARNINGS:
            log.warning("skipped line %d of %s: %s", number, self.settings.messages_path, problem)
        if self._stats.invalid_lines == MAX_INVALID_LINE_WARNINGS:
            log.warning("further invalid lines of %s are counted, not logged", self.settings.messages_path)

    # -- final drain -------------------------------------------------------------------------

    def drain(self, handler: PipesMessageHandler) -> None:
        """Poll until every file is read to its end (see :mod:`dagster_slurm.pipes.reader`),
        then deliver the unfinished last lines as they are."""
        start = self._clock()
        while True:
            self._stats.drain_polls += 1
            outcome = self._poll(handler)
            elapsed = self._clock() - start
            if self._settled(outcome, elapsed):
                break
            if isinstance(self._last_poll_error, AuthenticationFailed):
                # a login that needs a person (or refused credentials): no read can succeed
                # until someone logs in, so waiting out drain_timeout would only delay the step
                log.warning("the final read of the Pipes files stopped: %s",
                            self._last_poll_error)
                break
            if elapsed >= self.settings.drain_timeout:
                self._warn_unread()
                break
            if not (outcome.behind or outcome.got_data):
                left = max(self.settings.drain_timeout - elapsed, 0.0)
                self._sleep(min(self._drain_wait(), left))
        self._flush_pending(handler)

    def _drain_wait(self) -> float:
        """The job has ended: retry failures with backoff, otherwise look again soon."""
        if self._failures_in_a_row:
            return self.next_wait()
        return min(self.settings.poll_interval, DRAIN_POLL_INTERVAL)

    def _settled(self, outcome: _PollOutcome, elapsed: float) -> bool:
        """Every file is at its end with nothing new, and no ``closed`` message is awaited."""
        if not (outcome.ok and outcome.all_eof) or outcome.got_data:
            return False
        return self._seen_closed or not self._seen_opened or elapsed >= self.settings.closed_grace

    def _warn_unread(self) -> None:
        problems = []
        for stream in self._streams:
            if stream.complete:
                continue
            if stream.size is None:
                problems.append(f"{stream.path} (not reached)")
            else:
                left = max(stream.size - stream.offset, 0)
                problems.append(f"{stream.path} ({left} of {stream.size} bytes unread)")
        reason = f"; last error: {self._last_poll_error}" if self._last_poll_error else ""
        unread = ", ".join(problems) or "the payload's closed message was never received"
        log.warning(
            "the final read of the Pipes files did not finish within %.0f s: %s%s",
            self.settings.drain_timeout,
            unread,
            reason,
        )

    def _flush_pending(self, handler: PipesMessageHandler) -> None:
        for stream in self._streams:
            line = stream.take_pending()
            if line is None:
                continue
            if stream.name == "messages":
                log.warning(
                    "line %d of %s has no final newline; handling it as it is",
                    stream.lines + 1,
                    stream.path,
                )
            self._deliver(stream, line, handler)
