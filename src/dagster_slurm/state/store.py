"""Where the session document lives: a store interface with versioned, patched writes.

:class:`StateStore` has two methods: :meth:`~StateStore.load` returns ``(doc, version)``
without locking (:meth:`~StateStore.snapshot` adds the store's clock, for checking lease
expiry without writing), and :meth:`~StateStore.transact` applies a patch (see
:mod:`dagster_slurm.agent.remote.patch`) atomically and returns a
:class:`~dagster_slurm.agent.results.TxnResult`. Compare-and-set is a ``test`` on
``/version`` (or on any field), so callers never hold a lock across round trips.

Backends:

* :class:`AgentStateStore` — ``<session_dir>/allocation.json`` on the cluster, locked by the
  directory ``<session_dir>/lock``; each call is one agent round trip, and
  :meth:`AgentStateStore.txn_op` lets callers batch a transaction with other operations.
* :class:`MemoryStateStore` — a dict in this process, for unit tests and local mode.

Both run the same function (:func:`~dagster_slurm.agent.remote.document.transact_document`)
on the document, so they agree on versions, conflicts, ``value_now`` and errors.

Guarantees (both backends): transactions are serialised; a conflicting or failing patch
changes nothing; ``version`` rises by one per write and a patch that changes nothing does not
write; a document from a newer schema than ``max_schema_version`` is never modified
(``DocumentError``). The first transaction creates the document from ``initial``; without an
``initial`` document a transaction on a missing document raises ``DocumentError``.
Malformed patches raise :class:`~dagster_slurm.agent.exceptions.PatchRejected`.

Non-guarantees: ``load`` may return a slightly older version than a concurrent writer just
wrote (the file backend on NFS, see the agent's ``document`` module); decide with a ``test``
in the transaction, never with the loaded copy alone.
"""

from __future__ import annotations

import copy
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import op_error
from dagster_slurm.agent.ops import AgentOp, read_op, txn_op
from dagster_slurm.agent.remote.common import OpError
from dagster_slurm.agent.remote.document import document_version, transact_document
from dagster_slurm.agent.remote.patch import PatchConflict, PatchError
from dagster_slurm.agent.results import TxnResult
from dagster_slurm.state.patches import equals, replace
from dagster_slurm.state.schema import SCHEMA_VERSION

Patch = Sequence[Mapping[str, Any]]
DOCUMENT_NAME = "allocation.json"
LOCK_NAME = "lock"


@dataclass(frozen=True)
class Snapshot:
    """A document read without the lock, with the store's clock at the read."""

    doc: dict[str, Any] | None
    version: int
    now: float


class StateStore(ABC):
    """A versioned JSON document changed only by atomic patches."""

    @abstractmethod
    def snapshot(self) -> Snapshot:
        """The current document (None if it does not exist yet), its version and the clock."""

    def load(self) -> tuple[dict[str, Any] | None, int]:
        """The current document (None if it does not exist yet) and its version."""
        snap = self.snapshot()
        return snap.doc, snap.version

    @abstractmethod
    def transact(self, patch: Patch) -> TxnResult:
        """Apply ``patch`` atomically; ``ok`` False means a ``test``/``absent`` conflicted."""

    def save(self, doc: Mapping[str, Any], expected_version: int) -> TxnResult:
        """Replace the whole document if its version is still ``expected_version``."""
        return self.transact([equals("/version", expected_version), replace("", dict(doc))])


class AgentStateStore(StateStore):
    """The session document in ``session_dir`` on the cluster, through the agent."""

    def __init__(
        self,
        client: AgentClient,
        session_dir: str,
        *,
        initial: Mapping[str, Any] | None = None,
        lock_timeout: float = 30.0,
        max_schema_version: int | None = SCHEMA_VERSION,
    ) -> None:
        self.client = client
        self.path = f"{session_dir.rstrip('/')}/{DOCUMENT_NAME}"
        self.lock_path = f"{session_dir.rstrip('/')}/{LOCK_NAME}"
        self.initial = None if initial is None else dict(initial)
        self.lock_timeout = lock_timeout
        self.max_schema_version = max_schema_version

    def snapshot(self) -> Snapshot:
        op = read_op(self.path)
        response = self.client.call([op.to_request()], timeout=self.client.budget([op]))
        result = op.decode(response.results[0], 0)
        return Snapshot(result.doc, result.version, response.now)

    def transact(self, patch: Patch) -> TxnResult:
        return self.client.run(self.txn_op(patch))

    def txn_op(self, patch: Patch) -> AgentOp[TxnResult]:
        """The transaction as an op, to send in a batch with other operations."""
        return txn_op(
            self.path,
            self.lock_path,
            patch,
            lock_timeout=self.lock_timeout,
            create=self.initial,
            max_schema_version=self.max_schema_version,
        )


class MemoryStateStore(StateStore):
    """The document in this process's memory; thread-safe. ``clock`` plays the login node."""

    def __init__(
        self,
        initial: Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        max_schema_version: int | None = SCHEMA_VERSION,
    ) -> None:
        self.initial = None if initial is None else dict(initial)
        self.clock = clock
        self.max_schema_version = max_schema_version
        self._doc: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(copy.deepcopy(self._doc), document_version(self._doc), self.clock())

    def transact(self, patch: Patch) -> TxnResult:
        ops = [dict(op) for op in patch]
        with self._lock:
            now = self.clock()
            current = self._doc
            version = document_version(current)
            try:
                new, changed = transact_document(
                    current, ops, self.initial, now, self.max_schema_version
                )
            except PatchConflict as exc:
                return TxnResult(False, copy.deepcopy(current), version, exc.to_dict(), now=now)
            except PatchError as exc:
                raise _as_agent_error("PatchError", str(exc), current, version) from None
            except OpError as exc:
                raise _as_agent_error(exc.type, exc.message, current, version) from None
            if changed:
                self._doc = new
            return TxnResult(True, copy.deepcopy(new), new["version"], None, changed, now)


def _as_agent_error(
    type_: str, message: str, doc: dict[str, Any] | None, version: int
) -> Exception:
    raw = {"ok": False, "error": {"type": type_, "message": message}, "doc": doc}
    raw["version"] = version
    return op_error(raw, 0)
