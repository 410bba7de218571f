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
The polling itself (file positions, pacing, delivery, the final drain) is
:class:`~dagster_slurm.pipes.poller.TailPoller`; this module holds the Dagster-facing reader
that runs it in a thread.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dagster import PipesLaunchedData, PipesMessageHandler, PipesMessageReader
from dagster_pipes import PipesDefaultMessageWriter, PipesOpenedData, PipesParams

from dagster_slurm.pipes.poller import LineSink, ReaderStats, TailPoller
from dagster_slurm.pipes.sources import FileSource

__all__ = ["PipesTailMessageReader", "ReaderStats"]

DEFAULT_POLL_INTERVAL = 0.25
DEFAULT_IDLE_INTERVAL = 1.0
DEFAULT_MAX_BYTES_PER_FILE = 8 * 1024 * 1024
DEFAULT_DRAIN_TIMEOUT = 60.0


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
        self.opened_payload: PipesOpenedData | None = None
        self.launched_payload: PipesLaunchedData | None = None
        self._active = False
        self._poller = TailPoller(
            self,
            {"stdout": stdout_sink or _write_stdout, "stderr": stderr_sink or _write_stderr},
            tail_lines=tail_lines,
            clock=clock,
            sleep=sleep,
            label=type(self).__name__,
        )

    # -- public state ------------------------------------------------------------------------

    @property
    def stats(self) -> ReaderStats:
        """Counters of the current (or last) :meth:`read_messages` block."""
        return self._poller.stats

    @property
    def last_poll_error(self) -> Exception | None:
        """Why the latest poll failed; ``None`` when it succeeded (or none ran yet)."""
        return self._poller.last_poll_error

    @property
    def received_closed(self) -> bool:
        """Whether the payload's ``closed`` message has been delivered."""
        return self._poller.received_closed

    def stdout_tail(self, lines: int | None = None) -> str:
        """The last stdout lines read (at most ``tail_lines``), newline-separated."""
        return self._poller.tail("stdout", lines)

    def stderr_tail(self, lines: int | None = None) -> str:
        """The last stderr lines read (at most ``tail_lines``), newline-separated."""
        return self._poller.tail("stderr", lines)

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
        self._poller.reset()
        self._active = True
        # in a copy of the caller's context: what the step set there (the step log its
        # warnings are relayed to, see dagster_slurm.jobs.run_log) holds in the thread too
        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._poller.run, handler),
            name="pipes-tail-reader", daemon=True,
        )
        thread.start()
        try:
            yield {PipesDefaultMessageWriter.FILE_PATH_KEY: self.messages_path}
        finally:
            self._poller.stop()
            thread.join()
            try:
                self._poller.drain(handler)
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
        if self.last_poll_error is not None:
            text += f" The last read failed: {self.last_poll_error}."
        stderr = self.stderr_tail(20)
        if stderr:
            text += f"\nLast lines of stderr:\n{stderr}"
        return text

    def wake(self) -> None:
        """Poll now instead of at the end of the current wait (e.g. when the job starts)."""
        self._poller.wake()
