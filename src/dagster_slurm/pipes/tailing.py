"""Bookkeeping of tailed files, free of I/O: offsets, unfinished lines, answer checks.

:class:`TailedFile` turns the chunks read from one file into complete lines. Its ``offset``
is where the next read starts; the reader moves it only after the lines of a chunk have been
handled, and keeps the unfinished last line in ``pending`` until its newline arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dagster_slurm.agent.results import TailChunk, TailRequest

__all__ = ["TailedFile", "Throttle", "check_answer"]


@dataclass
class TailedFile:
    """Read position and unfinished line of one tailed file.

    ``max_line_bytes`` (None: unlimited) cuts a run of bytes without newline that grows longer
    than that into a line of its own, so a stream without newlines cannot grow without bound.
    ``size`` and ``complete`` (read to the end, no error) describe the latest chunk.
    """

    name: str
    path: str
    max_line_bytes: int | None = None
    offset: int = 0
    pending: bytearray = field(default_factory=bytearray)
    lines: int = 0
    size: int | None = None
    complete: bool = False

    def feed(self, data: bytes) -> list[bytes]:
        """The complete lines (without newline) of ``pending + data``; the rest stays pending."""
        end = data.rfind(b"\n")
        if end < 0:
            self.pending += data
            if self.max_line_bytes is not None and len(self.pending) > self.max_line_bytes:
                return [self._take()]
            return []
        block = bytes(self.pending) + data[:end] if self.pending else data[:end]
        self.pending = bytearray(data[end + 1 :])
        return block.split(b"\n")

    def take_pending(self) -> bytes | None:
        """The unfinished last line (None if there is none); it is no longer pending."""
        return self._take() if self.pending else None

    def restart(self) -> None:
        """Read the file again from its start (it was rewritten shorter)."""
        self.offset = 0
        self.pending.clear()
        self.complete = False

    def _take(self) -> bytes:
        line = bytes(self.pending)
        self.pending.clear()
        return line


class Throttle:
    """Allows one event per ``interval`` seconds and counts the suppressed ones."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self.clock = clock
        self.last: float | None = None
        self.suppressed = 0

    def ready(self) -> bool:
        now = self.clock()
        if self.last is None or now - self.last >= self.interval:
            self.last = now
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        count, self.suppressed = self.suppressed, 0
        return count


def check_answer(requests: Sequence[TailRequest], chunks: Sequence[TailChunk]) -> None:
    """Raise ``ValueError`` unless ``chunks`` answers ``requests`` one by one, consistently."""
    if len(chunks) != len(requests):
        raise ValueError(f"the source answered {len(chunks)} chunks for {len(requests)} files")
    for request, chunk in zip(requests, chunks, strict=True):
        if chunk.path != request.path:
            raise ValueError(f"the source answered {chunk.path} for {request.path}")
        if chunk.error or chunk.truncated:
            continue
        if chunk.offset - request.offset != len(chunk.data) or len(chunk.data) > request.max_bytes:
            raise ValueError(
                f"inconsistent chunk of {chunk.path}: {len(chunk.data)} bytes from offset "
                f"{request.offset} ending at {chunk.offset}"
            )
