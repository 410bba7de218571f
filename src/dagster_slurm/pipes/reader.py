"""A Pipes message reader that tails the payload's messages, stdout and stderr files.

:class:`PipesTailMessageReader` yields ``{"path": <messages file>}`` to the payload, whose
default message writer (``open_dagster_pipes()`` with no arguments) then appends one JSON
message per line to that file. A background thread polls the messages file and the job's
stdout and stderr files through a :class:`~dagster_slurm.pipes.sources.FileSource`, all three
in one ``source.read`` call (one round trip) per poll, and

* hands every message to Dagster's handler, in file order, exactly once;
* passes stdout/stderr lines to sinks (by default this process's ``sys.stdout`` /
  ``sys.stderr``, which Dagster captures as the step's compute logs) and keeps the last lines
  of each for error messages (:meth:`~PipesTailMessageReader.stdout_tail`).

Guarantees:

* Only complete lines are delivered; a partial last line waits for its newline (or for the
  end of the final drain, see below).
* Offsets advance only after a chunk has been handled. A poll that fails (dropped connection,
  timeout, unreadable answer) changes nothing and is retried with the same offsets after a
  short backoff, so nothing is lost or delivered twice; failures are logged at most every
  ``warning_interval`` seconds and the latest one is on :attr:`last_poll_error`.
* While a file has more data than one chunk (``max_bytes_per_file``), the next poll follows
  immediately; else it starts ``poll_interval`` after an empty poll, or after the start of
  one that brought data (at once if handing that to Dagster took longer), so a message is
  delivered within about ``poll_interval`` plus one round trip of being written.
* While none of the files exists yet (the job is still queued), the reader polls at
  ``poll_interval`` a few times (:data:`IDLE_POLLS_AT_POLL_INTERVAL`), then its wait doubles
  up to ``idle_interval`` (so a job that starts at once is seen at once, a queued one costs
  a poll per ``idle_interval``, to spare the login node);
  :meth:`~PipesTailMessageReader.wake` makes it poll at once (call it when the job is seen
  running).
* Leaving :meth:`read_messages` stops the thread and runs a final drain, which must happen
  after the job has ended: it polls until every file reports end-of-file with no new data
  (and, if the payload opened Pipes, until its ``closed`` message arrived or ``closed_grace``
  passed), bounded by ``drain_timeout``, after which a warning names the files not read to
  the end. Partial last lines are then delivered as they are.
* A line of the messages file that is not a JSON message is logged with its line number and
  skipped; an exception raised by the handler for one message is reported to Dagster as a
  framework exception and does not stop the reader.

Non-guarantees: a file that shrinks below the reader's offset (rewritten, e.g. by a requeued
job) is read again from its start, with a warning; lines of a rewritten messages file may
then be delivered again. Nothing orders messages relative to stdout/stderr lines.

Dagster's own threaded readers are not used as the base: they poll at whole-second
granularity, read logs in separate threads (one round trip each) and drop incomplete lines.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dagster import PipesLaunchedData, PipesMessageHandler, PipesMessageReader
from dagster_pipes import PipesDefaultMessageWriter, PipesOpenedData, PipesParams

from dagster_slurm.agent.results import TailChunk, TailRequest
from dagster_slurm.pipes.sources import FileSource
from dagster_slurm.pipes.tailing import TailedFile, Throttle, check_answer

__all__ = ["PipesTailMessageReader", "ReaderStats"]

log = logging.getLogger("dagster_slurm.pipes")

LineSink = Callable[[str], None]

DEFAULT_POLL_INTERVAL = 0.25
DEFAULT_IDLE_INTERVAL = 1.0
DEFAULT_MAX_BYTES_PER_FILE = 8 * 1024 * 1024
DEFAULT_DRAIN_TIMEOUT = 60.0
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
    """Counters of one :meth:`PipesTailMessageReader.read_messages` block (for benchmarks)."""

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


def _write_stdout(line: str) -> None:
    sys.stdout.write(line + "\n")


def _write_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


class PipesTailMessageReader(PipesMessageReader):
    """Reads the payload's messages file and its stdout/stderr files through a file source.

    Args:
        source: Where the files are read (:class:`~dagster_slurm.pipes.sources.AgentFileSource`
            for the cluster, :class:`~dagster_slurm.pipes.sources.LocalFileSource` locally).
        messages_path: The file the payload's default message writer appends to (a path as
            the payload sees it; also the path the source reads).
        stdout_path, stderr_path: The job's standard output and error files (``None``: not
            read). They may be the same file only if given once (pass ``stderr_path=None``).
        poll_interval: Seconds between polls once the reader has caught up.
        idle_interval: Seconds between polls while none of the files exists yet (at least
            ``poll_interval``; pass ``poll_interval`` to always poll at that rate).
        max_bytes_per_file: Most bytes read from one file in one poll.
        stdout_sink, stderr_sink: Called with each complete line (no newline, decoded as UTF-8
            with replacement characters); default: written to ``sys.stdout``/``sys.stderr``.
        tail_lines: How many last lines of stdout/stderr to keep for :meth:`stdout_tail`.
        drain_timeout: Longest the final drain may take.
        closed_grace: During the final drain, how long to keep polling for the payload's
            ``closed`` message after the files look complete (shared filesystems may show the
            last writes late); only when an ``opened`` message was seen.
        warning_interval: Least seconds between two warnings about failed polls.
        max_retry_interval: Longest wait between retries of failed polls (the wait doubles
            from ``poll_interval`` with every consecutive failure).
        clock, sleep: Time functions, replaceable in tests.
    """

    def __init__(
        self,
        source: FileSource,
        messages_path: str,
        stdout_path: str | None = None,
        stderr_path: str | None = None,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        idle_interval: float = DEFAULT_IDLE_INTERVAL,
        max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE,
        stdout_sink: LineSink | None = None,
        stderr_sink: LineSink | None = None,
        tail_lines: int = 100,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        closed_grace: float = 2.0,
        warning_interval: float = 5.0,
        max_retry_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        paths = [p for p in (messages_path, stdout_path, stderr_path) if p is not None]
        if not messages_path:
            raise ValueError("messages_path must not be empty")
        if len(set(paths)) != len(paths):
            raise ValueError(f"the tailed files must be distinct, got {paths}")
        if poll_interval <= 0 or max_bytes_per_file <= 0:
            raise ValueError("poll_interval and max_bytes_per_file must be positive")
        self.source = source
        self.messages_path = messages_path
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.poll_interval = poll_interval
        self.idle_interval = max(idle_interval, poll_interval)
        self.max_bytes_per_file = max_bytes_per_file
        self.drain_timeout = drain_timeout
        self.closed_grace = closed_grace
        self.warning_interval = warning_interval
        self.max_retry_interval = max_retry_interval
        self._sinks: dict[str, LineSink] = {
            "stdout": stdout_sink or _write_stdout,
            "stderr": stderr_sink or _write_stderr,
        }
        self._tails: dict[str, deque[str]] = {
            "stdout": deque(maxlen=tail_lines),
            "stderr": deque(maxlen=tail_lines),
        }
        self._clock = clock
        self._sleep = sleep
        self.opened_payload: PipesOpenedData | None = None
        self.launched_payload: PipesLaunchedData | None = None
        self._active = False
        self._reset()

    # -- public state ------------------------------------------------------------------------

    @property
    def stats(self) -> ReaderStats:
        """Counters of the current (or last) :meth:`read_messages` block."""
        return self._stats

    @property
    def last_poll_error(self) -> Exception | None:
        """Why the latest poll failed; ``None`` when it succeeded (or none ran yet)."""
        return self._last_poll_error

    @property
    def received_closed(self) -> bool:
        """Whether the payload's ``closed`` message has been delivered."""
        return self._seen_closed

    def stdout_tail(self, lines: int | None = None) -> str:
        """The last stdout lines read (at most ``tail_lines``), newline-separated."""
        return _last(self._tails["stdout"], lines)

    def stderr_tail(self, lines: int | None = None) -> str:
        """The last stderr lines read (at most ``tail_lines``), newline-separated."""
        return _last(self._tails["stderr"], lines)

    # -- PipesMessageReader ------------------------------------------------------------------

    @contextmanager
    def read_messages(self, handler: PipesMessageHandler) -> Iterator[PipesParams]:
        """Poll the files in a background thread; on exit stop it and drain the files.

        Leave the block only after the job has ended: the final drain reads the files to
        their end and then stops. One reader serves one block at a time; every block reads
        the files from their start.
        """
        if self._active:
            raise RuntimeError("this reader is already reading (one Pipes session at a time)")
        self._reset()
        self._active = True
        thread = threading.Thread(
            target=self._poll_loop, args=(handler,), name="pipes-tail-reader", daemon=True
        )
        thread.start()
        try:
            yield {PipesDefaultMessageWriter.FILE_PATH_KEY: self.messages_path}
        finally:
            self._stopping = True
            self._wakeup.set()
            thread.join()
            try:
                self._drain(handler)
            finally:
                self._active = False

    @property
    def expected_writer_count(self) -> int:
        """One writer: the payload's message writer (the same number Dagster assumes; stated
        here so that reading it does not raise Dagster's preview warning on every step)."""
        return 1

    def on_opened(self, opened_payload: PipesOpenedData) -> None:
        self.opened_payload = opened_payload

    def on_launched(self, launched_payload: PipesLaunchedData) -> None:
        self.launched_payload = launched_payload

    @property
    def launched_payload_hint(self) -> str:
        """What the job runner reported with ``PipesSession.report_launched`` ('' if nothing)."""
        extras = (self.launched_payload or {}).get("extras") or {}
        return ", ".join(f"{key}={value}" for key, value in sorted(extras.items()))

    def no_messages_debug_text(self) -> str:
        files = f"messages file {self.messages_path}"
        if self.stdout_path:
            files += f", stdout {self.stdout_path}"
        if self.stderr_path:
            files += f", stderr {self.stderr_path}"
        text = f"Attempted to read the {files} through {self.source!r}"
        if self.launched_payload_hint:
            text += f" (launched: {self.launched_payload_hint})"
        text += "."
        if self._last_poll_error is not None:
            text += f" The last read failed: {self._last_poll_error}."
        stderr = self.stderr_tail(20)
        if stderr:
            text += f"\nLast lines of stderr:\n{stderr}"
        return text

    # -- polling -----------------------------------------------------------------------------

    def _reset(self) -> None:
        self._streams = [TailedFile("messages", self.messages_path)]
        if self.stdout_path is not None:
            self._streams.append(TailedFile("stdout", self.stdout_path, MAX_LOG_LINE_BYTES))
        if self.stderr_path is not None:
            self._streams.append(TailedFile("stderr", self.stderr_path, MAX_LOG_LINE_BYTES))
        self._stats = ReaderStats()
        self._last_poll_error: Exception | None = None
        self._failures_in_a_row = 0
        self._poll_warnings = Throttle(self.warning_interval, self._clock)
        self._seen_opened = False
        self._seen_closed = False
        self._stopping = False
        self._wakeup = threading.Event()
        self._files_seen = False
        self._idle_polls = 0
        for tail in self._tails.values():
            tail.clear()

    def _poll_loop(self, handler: PipesMessageHandler) -> None:
        try:
            while not self._stopping:
                started = self._clock()
                outcome = self._poll(handler)
                if outcome.behind:
                    continue
                wait = self._next_wait()
                if outcome.got_data and not self._failures_in_a_row:  # a backlog is likely
                    wait -= self._clock() - started
                if wait > 0:
                    self._wakeup.wait(wait)
                self._wakeup.clear()
        except Exception:
            log.exception("the Pipes message reader thread failed; the final drain will retry")
            handler.report_pipes_framework_exception(
                f"{type(self).__name__} reader thread", sys.exc_info()
            )

    def wake(self) -> None:
        """Poll now instead of at the end of the current wait (e.g. when the job starts)."""
        self._wakeup.set()

    def _next_wait(self) -> float:
        if not self._failures_in_a_row:
            if self._files_seen:
                return self.poll_interval
            self._idle_polls += 1
            doublings = max(0, self._idle_polls - IDLE_POLLS_AT_POLL_INTERVAL)
            return min(self.idle_interval, self.poll_interval * 2 ** min(doublings, 16))
        backoff = self.poll_interval * 2 ** min(self._failures_in_a_row - 1, 16)
        return min(max(backoff, self.poll_interval), self.max_retry_interval)

    def _poll(self, handler: PipesMessageHandler) -> _PollOutcome:
        """One ``source.read`` for all files; applies the chunks only if all of them are sound."""
        requests = [TailRequest(s.path, s.offset, self.max_bytes_per_file) for s in self._streams]
        self._stats.polls += 1
        try:
            chunks = self.source.read(requests)
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
                self.source,
                type(exc).__name__,
                exc,
                more,
            )

    def _apply(self, stream: TailedFile, chunk: TailChunk, handler: PipesMessageHandler) -> None:
        stream.size = chunk.size
        self._files_seen = self._files_seen or chunk.exists
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
                f"{type(self).__name__} handling message {number} ({method})", sys.exc_info()
            )

    def _invalid_line(self, number: int, problem: str) -> None:
        self._stats.invalid_lines += 1
        if self._stats.invalid_lines <= MAX_INVALID_LINE_WARNINGS:
            log.warning("skipped line %d of %s: %s", number, self.messages_path, problem)
        if self._stats.invalid_lines == MAX_INVALID_LINE_WARNINGS:
            log.warning("further invalid lines of %s are counted, not logged", self.messages_path)

    # -- final drain -------------------------------------------------------------------------

    def _drain(self, handler: PipesMessageHandler) -> None:
        """Poll until every file is read to its end (see the module docstring), then flush."""
        start = self._clock()
        while True:
            self._stats.drain_polls += 1
            outcome = self._poll(handler)
            elapsed = self._clock() - start
            if self._settled(outcome, elapsed):
                break
            if elapsed >= self.drain_timeout:
                self._warn_unread()
                break
            if not (outcome.behind or outcome.got_data):
                self._sleep(min(self._drain_wait(), max(self.drain_timeout - elapsed, 0.0)))
        self._flush_pending(handler)

    def _drain_wait(self) -> float:
        """The job has ended: retry failures with backoff, otherwise look again soon."""
        if self._failures_in_a_row:
            return self._next_wait()
        return min(self.poll_interval, DRAIN_POLL_INTERVAL)

    def _settled(self, outcome: _PollOutcome, elapsed: float) -> bool:
        """Every file is at its end with nothing new, and no ``closed`` message is awaited."""
        if not (outcome.ok and outcome.all_eof) or outcome.got_data:
            return False
        return self._seen_closed or not self._seen_opened or elapsed >= self.closed_grace

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
            self.drain_timeout,
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


def _last(lines: deque[str], count: int | None) -> str:
    items = list(lines)
    if count is not None:
        items = items[-count:] if count > 0 else []
    return "\n".join(items)
