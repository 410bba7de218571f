"""What the orphan reconciliation asks of the cluster: one small interface.

:class:`AgentOrphanIO` does a tick's reading in one round trip, whatever the number of
sessions and jobs: the agent's ``scan`` finds and reads the run sessions' documents below
``<base>/sessions`` and the asset-scope jobs' records (with their heartbeat files) below
``<base>/runs``, and the same request gets every job of the user from the user's shared
squeue answer, which :meth:`AgentOrphanIO.queue` then serves (one squeue per
``status_max_age`` for all processes of the user, whatever the number of sensors). scancel,
transactions and removals, needed only when there is something to do, are one round trip
each. Unit tests give the reconciliation an in-memory implementation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import ValidationError

from dagster_slurm.agent import ScanSpec, remove_op, scan_op, txn_op
from dagster_slurm.agent.results import ScannedDocument
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.session.core.paths import SESSIONS_DIR
from dagster_slurm.session.orphans.assets import (
    HEARTBEAT_NAME,
    RECORD_DEPTH,
    RECORD_NAME,
    RUNS_DIR,
    AssetJobRecord,
    is_record_path,
    parse_record,
)
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
    reading the documents, and the user's jobs, are one round trip whatever their number."""

    def __init__(self, slurm: SlurmResource) -> None:
        self.slurm = slurm
        self._queue: StatusSnapshot | None = None

    def _roots(self) -> tuple[str, str]:
        base = self.slurm.base_path().rstrip("/")
        return f"{base}/{SESSIONS_DIR}", f"{base}/{RUNS_DIR}"

    def listing(self) -> OrphanListing:
        sessions_root, runs_root = self._roots()
        scheduler = self.slurm.scheduler()
        user_jobs = scheduler.user_status_op()
        with self.slurm.agent().batch() as batch:
            scan = batch.add(scan_op([
                ScanSpec(sessions_root, SESSION_DOCUMENT, 2),
                ScanSpec(runs_root, RECORD_NAME, RECORD_DEPTH, sibling=HEARTBEAT_NAME),
            ]))
            queue = batch.add(user_jobs) if user_jobs is not None else None
        now = batch.response.now if batch.response else 0.0
        self._queue = scheduler.snapshot(queue.result(), now) if queue is not None else None
        sessions: list[SessionRecord] = []
        jobs: list[AssetJobRecord] = []
        for entry in scan.result().entries:
            if entry.path.startswith(sessions_root + "/"):
                self._session(entry, now, sessions)
            elif is_record_path(entry.path, runs_root):
                self._record(entry, now, jobs)
        return OrphanListing(sessions, jobs)

    @staticmethod
    def _session(entry: ScannedDocument, now: float, out: list[SessionRecord]) -> None:
        try:
            if entry.error is not None:
                raise DagsterSlurmError(entry.error)
            doc = document(entry.doc)
        except (DagsterSlurmError, ValidationError) as exc:
            log.warning("skipping unreadable session document %s (left as it is): %s",
                        entry.path, exc)
            return
        if doc is not None:
            out.append(SessionRecord(entry.path, doc, now))

    @staticmethod
    def _record(entry: ScannedDocument, now: float, out: list[AssetJobRecord]) -> None:
        beat = entry.sibling.data if entry.sibling is not None and entry.sibling.exists else None
        try:
            if entry.error is not None:
                raise DagsterSlurmError(entry.error)
            record = parse_record(entry.path, entry.doc, beat, now)
        except DagsterSlurmError as exc:
            log.warning("skipping unreadable asset job record %s (left as it is): %s",
                        entry.path, exc)
            return
        if record is not None:
            out.append(record)

    def sessions(self) -> list[SessionRecord]:
        """The session documents of :meth:`listing`."""
        return self.listing().sessions

    def queue(self, job_names: Sequence[str]) -> StatusSnapshot:
        """The user's jobs as read with the last :meth:`listing` (every job of the user, so
        every job of ``job_names``; once), else one squeue for ``job_names``."""
        snapshot, self._queue = self._queue, None
        if snapshot is not None:
            return snapshot
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
