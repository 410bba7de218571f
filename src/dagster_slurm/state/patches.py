"""The patch builder of the session document: operation shapes, guards and checks, once.

Every transition table of this package builds its patches from here: the head's
(:mod:`~dagster_slurm.state.transitions`), the successor's
(:mod:`~dagster_slurm.state.successor_transitions`), the worker allocations'
(:mod:`~dagster_slurm.state.worker_transitions`) and the election's
(:mod:`~dagster_slurm.state.election_transitions`, whose claim is a lease of
:mod:`~dagster_slurm.state.lease`, built on these shapes as well). It holds:

* what a transition returns: :class:`Change` (a patch to apply under the session lock),
  :class:`Refused` (why not), and :class:`Edge` (one edge of a state table, :data:`ANY` for
  a session-wide one);
* the operation shapes of the patch language (:mod:`dagster_slurm.agent.remote.patch`), one
  dict each, keys in the order ``op``, ``path``, then the value: :func:`equals` and
  :func:`compare_now` (``test``), :func:`absent`, :func:`add`, :func:`add_now`, :func:`replace`,
  :func:`replace_now`, :func:`setdefault`, :func:`remove`, :func:`incr`. A ``*_now``
  operation's value is the store's clock at commit plus an offset, never the caller's clock;
* the guards, the ``test``/``absent`` operations a decision relied on: :func:`as_read`,
  :func:`submitting_guards`, :func:`submitted_guards`, :data:`SUBMIT_GUARDS`;
* the checks made before a patch is built, which refuse with words a user can act on:
  :func:`check_edge` (the table has the edge) and :func:`check_owned` (the head or successor
  record is still the caller's);
* the record moves several tables share: :func:`sbatch_answered_ops`,
  :func:`sbatch_failed_ops`, :func:`history_entry`, :func:`to_history`,
  :func:`replace_head_ops`.

The lease patches of :mod:`~dagster_slurm.state.lease` and the store's whole-document
``save`` use the same shapes. All functions are pure and return new dicts on every call;
none does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Literal, TypeVar

from dagster_slurm.agent.remote.patch import make_pointer
from dagster_slurm.state.schema import Allocation, SessionDocument

Op = Mapping[str, Any]
"""One patch operation (``{"op": ..., "path": ..., ...}``)."""

Patch = tuple[Op, ...]
"""The operations of one transaction, guards first."""

HEAD = "/allocation"
"""Pointer of the head allocation record."""

SUCCESSOR = "/successor"
"""Pointer of the successor record (a queued allocation that will replace the head)."""

HISTORY = "/history"
"""Pointer of the history of ended allocations (by job id, or token)."""

REPLACED_STATE = "REPLACED"
"""``final_state`` of a head record replaced by another allocation (a promoted successor, an
elected worker allocation)."""

Comparison = Literal["eq", "ne", "lt", "le", "gt", "ge"]


# -- what a transition returns -------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """A decided transition: apply ``patch`` under the session lock (guards first)."""

    transition: str
    patch: Patch


@dataclass(frozen=True)
class Refused:
    """A transition that does not apply to the document, and why (for the user)."""

    transition: str
    reason: str

    def __str__(self) -> str:
        return f"{self.transition} refused: {self.reason}"


Outcome = Change | Refused

S = TypeVar("S")

ANY = "*"
"""As an edge's source and target: a session-wide transition allowed in every state, which
keeps it."""


@dataclass(frozen=True)
class Edge(Generic[S]):
    """One allowed transition of a state table: from ``source``, ``name`` leads to
    ``target`` (the head's, worker and election tables use it)."""

    source: S
    name: str
    target: S
    why: str


# -- operation shapes ----------------------------------------------------------------------------
def equals(path: str, value: Any) -> dict[str, Any]:
    """Guard (a ``test`` operation): the value at ``path`` exists and equals ``value``."""
    return {"op": "test", "path": path, "value": value}


def compare_now(path: str, cmp: Comparison, offset: float = 0) -> dict[str, Any]:
    """Guard (a ``test`` operation): the number at ``path`` compares (``cmp``) with the
    store's clock at commit plus ``offset`` (e.g. ``"le"``: the time at ``path`` passed)."""
    return {"op": "test", "path": path, "cmp": cmp, "value_now": offset}


def absent(path: str) -> dict[str, Any]:
    """Guard: nothing (or ``null``) is at ``path``."""
    return {"op": "absent", "path": path}


def add(path: str, value: Any) -> dict[str, Any]:
    """Set ``path`` to ``value`` (its parent must exist)."""
    return {"op": "add", "path": path, "value": value}


def add_now(path: str, offset: float = 0) -> dict[str, Any]:
    """Set ``path`` to the store's clock at commit plus ``offset`` seconds."""
    return {"op": "add", "path": path, "value_now": offset}


def replace(path: str, value: Any) -> dict[str, Any]:
    """Replace the existing value at ``path`` with ``value``."""
    return {"op": "replace", "path": path, "value": value}


def replace_now(path: str, offset: float = 0) -> dict[str, Any]:
    """Replace the existing value at ``path`` with the store's clock plus ``offset``."""
    return {"op": "replace", "path": path, "value_now": offset}


def setdefault(path: str, value: Any) -> dict[str, Any]:
    """Set ``path`` to ``value`` unless something is there already."""
    return {"op": "setdefault", "path": path, "value": value}


def remove(path: str) -> dict[str, Any]:
    """Remove the existing value at ``path``."""
    return {"op": "remove", "path": path}


def incr(path: str, by: float) -> dict[str, Any]:
    """Add ``by`` to the number at ``path`` (a missing member counts as 0)."""
    return {"op": "incr", "path": path, "value": by}


# -- guards --------------------------------------------------------------------------------------
def as_read(path: str, value: Any) -> dict[str, Any]:
    """Guard: ``path`` holds ``value`` as read; a ``value`` of None (the field was missing or
    null when read) means it must still be absent or null."""
    return absent(path) if value is None else equals(path, value)


SUBMIT_GUARDS: Patch = (absent("/closed_at"),)
"""What must hold when a submission's token is recorded: the session is not closed (passed
to the agent's submit operation, which checks it under the same lock)."""


def submitting_guards(pointer: str, token: str | None) -> Patch:
    """Guards: the record at ``pointer`` is ``token``'s (when given) and still SUBMITTING."""
    owner = () if token is None else (equals(f"{pointer}/token", token),)
    return (*owner, equals(f"{pointer}/status", "submitting"))


def submitted_guards(job_id: str, pointer: str = HEAD) -> Patch:
    """Guards: the record at ``pointer`` is job ``job_id``'s and has a job id (for the head:
    SUBMITTED, READY or DRAINING)."""
    return (equals(f"{pointer}/job_id", job_id), equals(f"{pointer}/status", "submitted"))


# -- checks before a patch is built --------------------------------------------------------------
def _source_name(source: Any) -> str:
    return str(source.value if isinstance(source, Enum) else source)


def check_edge(edges: Iterable[Edge[Any]], state: Any, name: str, subject: str,
               described: str | None = None) -> Refused | None:
    """Refused when ``edges`` (a state table) has no edge ``name`` from ``state`` (None: go
    on); an edge from :data:`ANY` allows every state. The reason names ``subject`` (e.g.
    ``"the election"``), its state as ``described`` (default: the state's value) and the
    states ``name`` applies in."""
    edges = tuple(edges)
    if any(e.name == name and (e.source == state or e.source == ANY) for e in edges):
        return None
    sources = sorted(_source_name(e.source) for e in edges if e.name == name)
    told = _source_name(state) if described is None else described
    return Refused(name, f"{subject} is {told}; {name} applies only when it is "
                         f"{' or '.join(sources)}")


RECORD_SUBJECTS: Mapping[str, str] = {"allocation": "the head allocation",
                                      "successor": "the successor"}
"""The records :func:`check_owned` checks, by field of the document, as the user reads them."""


def check_owned(doc: SessionDocument | None, name: str, key: str, value: str, *,
                record: Literal["allocation", "successor"] = "allocation") -> Refused | None:
    """Refused unless ``doc``'s ``record`` (the head, or the successor) has ``key`` (``token``
    or ``job_id``) equal to ``value`` (None: go on). Without a document (the caller did not
    read it) only the patch's guards decide."""
    if doc is None:
        return None
    current: Allocation | None = getattr(doc, record)
    if current is None or getattr(current, key) != value:
        now = "absent" if current is None else f"{key} {getattr(current, key)!r}"
        return Refused(name, f"{RECORD_SUBJECTS[record]} is no longer the one with {key} "
                             f"{value!r} (now {now})")
    return None


# -- record moves --------------------------------------------------------------------------------
def sbatch_answered_ops(pointer: str, token: str | None, job_id: str, rc: int | None) -> Patch:
    """The record at ``pointer`` (a head, successor or worker submission; ``token``'s when
    given), still SUBMITTING, becomes SUBMITTED as job ``job_id`` with sbatch's ``rc``."""
    return (*submitting_guards(pointer, token),
            add(f"{pointer}/status", "submitted"),
            add(f"{pointer}/job_id", job_id),
            add(f"{pointer}/rc", rc),
            add_now(f"{pointer}/finished_at"))


def sbatch_failed_ops(pointer: str, token: str | None, error: str, rc: int | None,
                      in_doubt: bool) -> Patch:
    """The record at ``pointer`` (``token``'s when given), still SUBMITTING, becomes
    ``failed`` (sbatch refused) or ``unknown`` (``in_doubt``: sbatch did not answer), keeping
    sbatch's ``rc`` and the end of its message."""
    return (*submitting_guards(pointer, token),
            add(f"{pointer}/status", "unknown" if in_doubt else "failed"),
            add(f"{pointer}/rc", rc),
            add(f"{pointer}/error", error[-2000:]),
            add_now(f"{pointer}/finished_at"))


def history_entry(doc: SessionDocument, pointer: str,
                  final_state: str | None) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """``(raw record as read, history name, history entry)`` of the record at ``pointer``
    (:data:`HEAD` or :data:`SUCCESSOR`): the raw form is the guard's value (only the fields
    the document holds), the name its job id (or token), the entry every field with
    ``final_state``."""
    key = pointer.strip("/")
    raw = doc.model_dump(mode="json", exclude_unset=True)[key]
    record = doc.model_dump(mode="json")[key]
    return raw, str(record.get("job_id") or record.get("token")), dict(
        record, final_state=final_state)


def to_history(name: str, entry: Mapping[str, Any], *, exclusive: bool = False) -> Patch:
    """Write ``entry`` to ``/history/<name>``, stamped ``ended_at`` at the store's clock;
    ``exclusive``: only if no entry has that name yet."""
    unused = (absent(make_pointer("history", name)),) if exclusive else ()
    return (setdefault(HISTORY, {}),
            *unused,
            add(make_pointer("history", name), entry),
            add_now(make_pointer("history", name, "ended_at")))


def replace_head_ops(doc: SessionDocument) -> list[Op]:
    """Patch operations retiring the head record so that another allocation can take its
    place: the head, unchanged since ``doc`` was read, goes to the history as
    :data:`REPLACED_STATE` (stamped ``ended_at``); without a head record, none may have
    appeared meanwhile."""
    if doc.allocation is None:
        return [absent(HEAD)]
    raw, name, entry = history_entry(doc, HEAD, REPLACED_STATE)
    return [equals(HEAD, raw), *to_history(name, entry)]
