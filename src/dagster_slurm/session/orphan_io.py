"""What the orphan reconciliation asks of the cluster: one small interface.

:class:`AgentOrphanIO` lists the run sessions' documents and the asset-scope jobs' records
in one round trip (one ``find`` over ``<base>/sessions`` and ``<base>/runs``) and reads them
all, heartbeat files included, in one more; squeue, scancel, transactions and removals
are one round trip each. Unit tests give the reconciliation an in-memory implementation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import ValidationError

from dagster_slurm.agent import exec_op, read_op, remove_op, tail_op, txn_op
from dagster_slurm.agent.results import TailRequest
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.session.orphan_assets import (
    RECORD_DEPTH,
    RECORD_NAME,
    RUNS_DIR,
    AssetJobRecord,
    heartbeat_path_of,
    is_record_path,
    parse_record,
)
from dagster_slurm.session.paths import SESSIONS_DIR
from dagster_slurm.state.schema import SessionDocument
from dagster_slurm.state.transitions import Change, document

log = logging.getLogger("dagster_slurm.session")

SESSION_DOCUMENT = "allocation.json"


@dataclass(frozen=True)
class SessionRecord:
    """One session document as the reconciliation read it: its ``path`` on the cluster, the
    typed ``doc``, and the login node's clock at the read (``now``)."""

    path: str
    doc: SessionDocument
    now: float


@dataclass(frozen=True)
class OrphanListing:
    """Everything one scan read: the run sessions and the asset-scope jobs' records."""

    sessions: list[SessionRecord] = field(default_factory=list)
    asset_jobs: list[AssetJobRecord] = field(default_factory=list)


class OrphanIO(Protocol):
    """What the reconciliation asks of the cluster (unit tests give an in-memory one)."""

    def listing(self) -> OrphanListing:
        """Every readable session document and asset job record under the base path
        (unreadable ones skipped)."""

    def queue(self, job_names: Sequence[str]) -> StatusSnapshot:
        """One squeue for the job names."""

    def cancel(self, job_name: str) -> None:
        """scancel every job of ``job_name``."""

    def cancel_jobs(self, job_ids: Sequence[str]) -> None:
        """scancel the jobs ``job_ids``."""

    def apply(self, path: str, change: Change) -> None:
        """Apply a transition to the document at ``path`` under its lock."""

    def prune(self, session_dirs: Sequence[str]) -> None:
        """Remove closed sessions' directories."""


class AgentOrphanIO:
    """:class:`OrphanIO` through the agent of ``slurm`` (a SlurmResource): listing and
    reading the documents is two round trips whatever their number."""

    def __init__(self, slurm: SlurmResource) -> None:
        self.slurm = slurm

    def _roots(self) -> tuple[str, str]:
        base = self.slurm.base_path().rstrip("/")
        return f"{base}/{SESSIONS_DIR}", f"{base}/{RUNS_DIR}"

    def _find(self) -> tuple[list[str], list[str]]:
        """``(session documents, asset job records)`` in one round trip (a missing root
        lists nothing)."""
        sessions_root, runs_root = self._roots()
        found = self.slurm.agent().run(exec_op(
            ["find", sessions_root, runs_root, "-mindepth", "2", "-maxdepth", str(RECORD_DEPTH),
             "(", "-name", SESSION_DOCUMENT, "-o", "-name", RECORD_NAME, ")", "-type", "f",
             "-print"],
            timeout=60,
        ))
        sessions, records = [], []
        for line in found.stdout.splitlines():
            path = line.strip()
            if path.startswith(sessions_root + "/") and path.endswith("/" + SESSION_DOCUMENT) \
                    and path[len(sessions_root) + 1:].count("/") == 1:
                sessions.append(path)
            elif is_record_path(path, runs_root):
                records.append(path)
        return sessions, records

    def listing(self) -> OrphanListing:
        session_paths, record_paths = self._find()
        if not session_paths and not record_paths:
            return OrphanListing()
        with self.slurm.agent().batch() as batch:
            reads = [batch.add(read_op(path)) for path in session_paths + record_paths]
            beats = batch.add(tail_op([TailRequest(heartbeat_path_of(p), 0, 256)
                                       for p in record_paths])) if record_paths else None
        now = batch.response.now if batch.response else 0.0
        sessions: list[SessionRecord] = []
        for path, pending in zip(session_paths, reads, strict=False):
            try:
                doc = document(pending.result().doc)
            except (DagsterSlurmError, ValidationError) as exc:
                log.warning("skipping unreadable session document %s (left as it is): %s",
                            path, exc)
                continue
            if doc is not None:
                sessions.append(SessionRecord(path, doc, now))
        chunks = beats.result().files if beats is not None else ()
        texts = {c.path: (c.data if c.exists else None) for c in chunks}
        jobs: list[AssetJobRecord] = []
        for path, pending in zip(record_paths, reads[len(session_paths):], strict=True):
            try:
                record = parse_record(path, pending.result().doc,
                                      texts.get(heartbeat_path_of(path)), now)
            except DagsterSlurmError as exc:
                log.warning("skipping unreadable asset job record %s (left as it is): %s",
                            path, exc)
                continue
            if record is not None:
                jobs.append(record)
        return OrphanListing(sessions, jobs)

    def sessions(self) -> list[SessionRecord]:
        """The session documents of :meth:`listing`."""
        return self.listing().sessions

    def queue(self, job_names: Sequence[str]) -> StatusSnapshot:
        return self.slurm.scheduler().status(list(job_names), accounting=False)

    def cancel(self, job_name: str) -> None:
        self.slurm.scheduler().cancel(job_name=job_name)

    def cancel_jobs(self, job_ids: Sequence[str]) -> None:
        self.slurm.scheduler().cancel(list(job_ids))

    def apply(self, path: str, change: Change) -> None:
        lock = path.rsplit("/", 1)[0] + "/lock"
        self.slurm.agent().run(txn_op(path, lock, change.patch))

    def prune(self, session_dirs: Sequence[str]) -> None:
        """Remove closed sessions' directories, in one round trip."""
        root = self._roots()[0]
        with self.slurm.agent().batch() as batch:
            removals = [batch.add(remove_op(path, root=root)) for path in session_dirs]
        for path, removal in zip(session_dirs, removals, strict=True):
            try:
                removal.result()
                log.info("removed closed run session %s", path)
            except DagsterSlurmError as exc:
                log.warning("could not remove closed run session %s: %s", path, exc)
