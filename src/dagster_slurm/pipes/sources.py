"""Where the message reader gets its bytes: a :class:`FileSource` reads several files at once.

A source answers one call of :meth:`FileSource.read` with one
:class:`~dagster_slurm.agent.results.TailChunk` per request, in request order, with the
semantics of the agent's ``tail`` operation:

* ``data`` starts exactly at the requested offset and holds at most ``max_bytes`` bytes;
  ``offset`` is where the next read starts (requested offset + ``len(data)``), so a caller
  that resumes from it neither loses nor repeats a byte;
* a missing file is ``exists=False`` with no data and ``eof=True``;
* a file shorter than the requested offset is ``truncated=True`` with no data;
* another read failure is reported in ``error`` (the call itself succeeds).

A call either returns every chunk or raises (for a remote source typically a
:class:`~dagster_slurm.errors.TransportError`); it never changes anything, so retrying with
the same requests is always safe.

Two implementations:

* :class:`AgentFileSource` — the files live on the cluster; one call is one round trip of the
  cluster-side agent's ``tail`` operation for all files.
* :class:`LocalFileSource` — the files are on this machine (local mode, tests); reads them
  directly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import tail_op
from dagster_slurm.agent.results import TailChunk, TailRequest

__all__ = ["AgentFileSource", "FileSource", "LocalFileSource", "WatchingFileSource"]


@runtime_checkable
class FileSource(Protocol):
    """Reads new bytes of several files in one call (see the module docstring for semantics)."""

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        """One chunk per request, in order; raises when the files could not be reached."""
        ...


class AgentFileSource:
    """Reads files on the cluster through the agent's ``tail`` operation.

    Every :meth:`read` is exactly one ``client.run`` (one transport round trip), whatever the
    number of files. ``timeout`` bounds the round trip (default: the client's budget for the
    operation).
    """

    def __init__(self, client: AgentClient, *, timeout: float | None = None) -> None:
        self.client = client
        self.timeout = timeout

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        if not requests:
            return []
        return list(self.client.run(tail_op(requests), timeout=self.timeout).files)

    def __repr__(self) -> str:
        return f"AgentFileSource({self.client.transport!r})"


class WatchingFileSource:
    """A :class:`FileSource` that also looks for one more file in every read: ``watched``
    (e.g. a job's exit-status file), in the same call as the tailed files, so in the same
    round trip. ``on_appeared`` is called once, from the reading thread, the first time a
    read finds it; the callers of :meth:`read` never see it."""

    def __init__(self, inner: FileSource, watched: str, on_appeared: Callable[[], None]) -> None:
        self.inner = inner
        self.watched = watched
        self.on_appeared = on_appeared
        self.appeared = False

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        if self.appeared:
            return self.inner.read(requests)
        chunks = self.inner.read([*requests, TailRequest(self.watched, 0, 1)])
        found = chunks.pop() if len(chunks) == len(requests) + 1 else None
        if found is not None and found.exists and not self.appeared:
            self.appeared = True
            self.on_appeared()
        return chunks

    def __repr__(self) -> str:
        return repr(self.inner)


class LocalFileSource:
    """Reads files on this machine directly, with the same semantics as the agent."""

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        return [read_local_chunk(request) for request in requests]

    def __repr__(self) -> str:
        return "LocalFileSource()"


def read_local_chunk(request: TailRequest) -> TailChunk:
    """Read one file of this machine as the agent's ``tail`` would (a negative offset
    counts from the end: the last ``-offset`` bytes)."""
    path, offset = request.path, request.offset
    exists, size = False, None
    try:
        with open(path, "rb") as f:
            exists, size = True, os.fstat(f.fileno()).st_size
            if offset < 0:
                offset = max(0, size + offset)
            if offset > size:
                return TailChunk(path, True, size, offset, b"", True, True)
            f.seek(offset)
            data = f.read(min(max(request.max_bytes, 1), size - offset))
    except FileNotFoundError:
        return TailChunk(path, False, None, offset, b"", True, False)
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
        return TailChunk(path, exists, size, offset, b"", True, False, error)
    end = offset + len(data)
    return TailChunk(path, True, size, end, data, end >= size, False)
