"""Typed results of the agent's operations, decoded from the agent's JSON answers.

Every ``from_raw`` takes one operation's result dict (as sent by the agent) and never
raises for the fields the agent always sends; missing optional fields get neutral values.
``warnings`` carries the agent's warnings (for example a broken stale lock).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _warnings(raw: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(w) for w in raw.get("warnings") or ())


@dataclass(frozen=True)
class ExecResult:
    """A command's exit code and output (the tail, when ``*_truncated`` is set)."""

    rc: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> ExecResult:
        return cls(
            raw.get("rc"),
            raw.get("stdout", ""),
            raw.get("stderr", ""),
            bool(raw.get("stdout_truncated")),
            bool(raw.get("stderr_truncated")),
            _warnings(raw),
        )


@dataclass(frozen=True)
class TxnResult:
    """Outcome of a state transaction.

    ``ok`` is False when a ``test``/``absent`` failed; ``conflict`` then describes it (index,
    op, path, reason, exists, actual) and nothing was written. ``doc``/``version`` are the
    document after the transaction (or the unchanged current one). ``now`` is the store's
    clock while the lock was held (the login node's clock for the file store).
    """

    ok: bool
    doc: dict[str, Any] | None
    version: int
    conflict: dict[str, Any] | None = None
    written: bool = False
    now: float | None = None
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> TxnResult:
        return cls(
            bool(raw.get("ok")),
            raw.get("doc"),
            int(raw.get("version") or 0),
            raw.get("conflict"),
            bool(raw.get("written")),
            raw.get("now"),
            _warnings(raw),
        )


@dataclass(frozen=True)
class ReadResult:
    """A document read without the lock; ``doc`` is None and ``version`` 0 when missing."""

    exists: bool
    doc: dict[str, Any] | None
    version: int

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> ReadResult:
        return cls(bool(raw.get("exists")), raw.get("doc"), int(raw.get("version") or 0))


@dataclass(frozen=True)
class TailRequest:
    """Read ``path`` from byte ``offset``, at most ``max_bytes``."""

    path: str
    offset: int = 0
    max_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class TailChunk:
    """Bytes of one file from the requested offset; ``offset`` is where the next read starts."""

    path: str
    exists: bool
    size: int | None
    offset: int
    data: bytes
    eof: bool
    truncated: bool
    error: str | None = None

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> TailChunk:
        return cls(
            raw["path"],
            bool(raw.get("exists")),
            raw.get("size"),
            int(raw.get("offset") or 0),
            base64.b64decode(raw.get("data") or ""),
            bool(raw.get("eof")),
            bool(raw.get("truncated")),
            raw.get("error"),
        )


@dataclass(frozen=True)
class TailResult:
    """One chunk per requested file, in request order."""

    files: tuple[TailChunk, ...]

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> TailResult:
        return cls(tuple(TailChunk.from_raw(f) for f in raw.get("files") or ()))


@dataclass(frozen=True)
class ScannedDocument:
    """One document a ``scan`` found: its ``path``, the ``doc`` (None when it vanished or
    could not be read; ``error`` then says why, None otherwise), its ``version`` and, when a
    sibling file was asked for, that file's first bytes (``sibling`` None: not asked)."""

    path: str
    doc: dict[str, Any] | None
    version: int
    error: str | None = None
    sibling: StatusFile | None = None


@dataclass(frozen=True)
class ScanResult:
    """The documents a ``scan`` found, in root order, then path order."""

    entries: tuple[ScannedDocument, ...]

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> ScanResult:
        entries = []
        for e in raw.get("entries") or ():
            sib = e.get("sibling")
            entries.append(ScannedDocument(
                e["path"], e.get("doc"), int(e.get("version") or 0), e.get("error"),
                None if sib is None else StatusFile(bool(sib.get("exists")), sib.get("data"))))
        return cls(tuple(entries))


@dataclass(frozen=True)
class CommandOutput:
    """Raw output of a scheduler command; ``rc`` is None when it timed out or did not start.

    ``shared_at`` is set when the answer came from the user's shared squeue answer on the
    login node (login-node epoch seconds at which that squeue was started; None otherwise);
    ``ran`` says whether this request ran the command itself (False: it was served an answer
    another request had produced, so it cost the scheduler nothing).
    """

    rc: int | None
    stdout: str
    stderr: str
    error: str | None = None
    shared_at: float | None = None
    ran: bool = True

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> CommandOutput:
        shared = raw.get("shared") or {}
        return cls(raw.get("rc"), raw.get("stdout", ""), raw.get("stderr", ""), raw.get("error"),
                   shared.get("at"), bool(shared.get("ran", True)))


@dataclass(frozen=True)
class StatusFile:
    """A job's exit-status file as read on the login node (``data`` None when missing)."""

    exists: bool
    data: str | None


@dataclass(frozen=True)
class JobStatusResult:
    """Raw squeue output, the known ids squeue did not list, status files and sacct output.

    ``absent_ids`` is None when squeue failed (nothing can be concluded then); ``sacct`` is
    None when it was not needed or not requested; ``sacct_ids`` are the ids it was asked for.
    """

    squeue: CommandOutput
    absent_ids: tuple[str, ...] | None
    status_files: dict[str, StatusFile] = field(default_factory=dict)
    sacct_ids: tuple[str, ...] = ()
    sacct: CommandOutput | None = None

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> JobStatusResult:
        absent = raw.get("absent_ids")
        sacct = raw.get("sacct")
        return cls(
            CommandOutput.from_raw(raw.get("squeue") or {}),
            None if absent is None else tuple(absent),
            {
                k: StatusFile(bool(v.get("exists")), v.get("data"))
                for k, v in (raw.get("status_files") or {}).items()
            },
            tuple(raw.get("sacct_ids") or ()),
            None if sacct is None else CommandOutput.from_raw(sacct),
        )


@dataclass(frozen=True)
class ObserveResult:
    """One look at a run session (the agent's ``observe_session``): the document as read
    (None before it exists) and its ``version``, the job ids it knows, the scheduler's
    answer for them (as a :class:`JobStatusResult`) and the files read ({path: file})."""

    doc: dict[str, Any] | None
    version: int
    known_ids: tuple[str, ...]
    status: JobStatusResult
    files: dict[str, StatusFile] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> ObserveResult:
        return cls(
            raw.get("doc"),
            int(raw.get("version") or 0),
            tuple(str(i) for i in raw.get("known_ids") or ()),
            JobStatusResult.from_raw(raw),
            {k: StatusFile(bool(v.get("exists")), v.get("data"))
             for k, v in (raw.get("files") or {}).items()},
        )


@dataclass(frozen=True)
class SubmitResult:
    """Outcome of a token-recorded submission.

    ``status`` is ``submitted`` (``job_id`` set), ``failed`` (sbatch exited non-zero) or
    ``unknown`` (timeout or unreadable output: look the job up by its token). ``recovered``
    means the token had been submitted before and sbatch was not run again; ``recorded``
    False means the outcome could not be written to the state document (see ``warnings``).
    """

    job_id: str | None
    status: str
    rc: int | None
    stdout: str
    stderr: str
    recovered: bool = False
    recorded: bool = False
    doc: dict[str, Any] | None = None
    version: int | None = None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "submitted" and self.job_id is not None

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> SubmitResult:
        return cls(
            raw.get("job_id"),
            str(raw.get("status", "unknown")),
            raw.get("rc"),
            raw.get("stdout", ""),
            raw.get("stderr", ""),
            bool(raw.get("recovered")),
            bool(raw.get("recorded")),
            raw.get("doc"),
            raw.get("version"),
            _warnings(raw),
        )


@dataclass(frozen=True)
class PathResult:
    """Outcome of ``write_file``/``mkdir``/``remove``: ``changed`` means created or removed.

    ``woken``: for a ``write_file`` with ``wake``, whether a reader of that FIFO got the
    line (False: none on the agent's host, or no FIFO); None without ``wake``.
    """

    path: str
    changed: bool
    woken: bool | None = None

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> PathResult:
        woken = raw.get("woken")
        return cls(raw["path"], bool(raw.get("created", raw.get("existed", True))),
                   None if woken is None else bool(woken))
