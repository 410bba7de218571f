"""Find run sessions whose supervisor died, cancel their allocations and fail their runs.

A session is an orphan when its run is unfinished in the Dagster instance but no process
has written its heartbeat, and the run has written no event, for ``heartbeat_timeout``
seconds (the run's process was SIGKILLed, its machine died), or when its run has finished but an allocation of the
session is still in the queue (a teardown that could not cancel). Sessions of runs the
instance does not know are left alone: the base path may be shared with other deployments.

Cost: one round trip lists the session documents, one reads them, one squeue covers every
candidate's job name; each orphan costs one scancel and one transaction. Sessions closed
longer ago than ``prune_closed_after`` (7 days) are removed in one more round trip, so the
scan stays short.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from dagster_slurm.agent import exec_op, read_op, txn_op
from dagster_slurm.errors import ConfigurationError, DagsterSlurmError
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.session.paths import SESSIONS_DIR
from dagster_slurm.state.schema import SessionDocument
from dagster_slurm.state.transitions import Change, close_session, document

log = logging.getLogger("dagster_slurm.session")

_UNFINISHED = frozenset({"STARTED", "STARTING", "CANCELING", "NOT_STARTED", "QUEUED"})
_FINISHED = frozenset({"SUCCESS", "FAILURE", "CANCELED"})


@dataclass(frozen=True)
class OrphanReport:
    """One session the reconciliation acted on.

    ``run_id``: the Dagster run. ``job_name``: the session's Slurm job name. ``job_ids``:
    its jobs that were still in the queue (and were cancelled). ``reason``: why it was
    judged orphaned. ``run_marked_failed``: whether the run was marked failed.
    """

    run_id: str
    job_name: str
    job_ids: tuple[str, ...]
    reason: str
    run_marked_failed: bool


@dataclass(frozen=True)
class SessionRecord:
    """One session document as the reconciliation read it: its ``path`` on the cluster, the
    typed ``doc``, and the login node's clock at the read (``now``)."""

    path: str
    doc: SessionDocument
    now: float


class OrphanIO(Protocol):
    """What the reconciliation asks of the cluster (unit tests give an in-memory one)."""

    def sessions(self) -> list[SessionRecord]:
        """Every readable session document under the base path (unreadable ones skipped)."""

    def queue(self, job_names: Sequence[str]) -> StatusSnapshot:
        """One squeue for the job names."""

    def cancel(self, job_name: str) -> None:
        """scancel every job of ``job_name``."""

    def apply(self, path: str, change: Change) -> None:
        """Apply a transition to the document at ``path`` under its lock."""

    def prune(self, session_dirs: Sequence[str]) -> None:
        """Remove closed sessions' directories."""


class AgentOrphanIO:
    """:class:`OrphanIO` through the agent of ``slurm`` (a SlurmResource): listing and
    reading the documents is two round trips whatever their number."""

    def __init__(self, slurm: SlurmResource) -> None:
        self.slurm = slurm

    def sessions(self) -> list[SessionRecord]:
        agent = self.slurm.agent()
        root = f"{self.slurm.base_path()}/{SESSIONS_DIR}"
        found = agent.run(exec_op(
            ["find", root, "-mindepth", "2", "-maxdepth", "2", "-name", "allocation.json"],
            timeout=60,
        ))
        paths = [p for p in found.stdout.splitlines() if p.strip()]
        if not paths:
            return []
        with agent.batch() as batch:
            reads = [batch.add(read_op(path)) for path in paths]
        now = batch.response.now if batch.response else 0.0
        records = []
        for path, pending in zip(paths, reads, strict=True):
            try:
                doc = document(pending.result().doc)
            except (DagsterSlurmError, ValidationError) as exc:
                log.warning("skipping unreadable session document %s (left as it is): %s",
                            path, exc)
                continue
            if doc is not None:
                records.append(SessionRecord(path, doc, now))
        return records

    def queue(self, job_names: Sequence[str]) -> StatusSnapshot:
        return self.slurm.scheduler().status(list(job_names), accounting=False)

    def cancel(self, job_name: str) -> None:
        self.slurm.scheduler().cancel(job_name=job_name)

    def apply(self, path: str, change: Change) -> None:
        lock = path.rsplit("/", 1)[0] + "/lock"
        self.slurm.agent().run(txn_op(path, lock, change.patch))

    def prune(self, session_dirs: Sequence[str]) -> None:
        """Remove closed sessions' directories, in one round trip."""
        from dagster_slurm.agent import remove_op

        root = f"{self.slurm.base_path()}/{SESSIONS_DIR}"
        with self.slurm.agent().batch() as batch:
            removals = [batch.add(remove_op(path, root=root)) for path in session_dirs]
        for path, removal in zip(session_dirs, removals, strict=True):
            try:
                removal.result()
                log.info("removed closed run session %s", path)
            except DagsterSlurmError as exc:
                log.warning("could not remove closed run session %s: %s", path, exc)


def _last_sign_of_life(doc: SessionDocument) -> float | None:
    head = doc.allocation
    times = [doc.heartbeat.at if doc.heartbeat else None,
             head.submitted_at if head else None, doc.created_at]
    known = [float(t) for t in times if t is not None]
    return max(known) if known else None


class _Unknown(Exception):
    """The instance could not say what a session's run is doing; ``args[0]`` says why."""


def _quiet_for(instance: Any, run_id: str, clock: Callable[[], float] = time.time) -> float | None:
    """Seconds since the run's last event in the instance (None when it has none).

    Raises :class:`_Unknown` when the events cannot be read: a run whose activity is
    unknown is never judged quiet.
    """
    try:
        records = instance.get_records_for_run(run_id, ascending=False, limit=1).records
    except Exception as exc:  # noqa: BLE001 - turned into _Unknown, which keeps the session
        raise _Unknown(f"its events could not be read ({type(exc).__name__}: {exc})") from exc
    if not records:
        return None
    return max(0.0, clock() - records[0].event_log_entry.timestamp)


def _run_of(instance: Any, run_id: str) -> Any:
    """The instance's run ``run_id`` (None when the instance does not know it); raises
    :class:`_Unknown` when the instance cannot be read."""
    try:
        return instance.get_run_by_id(run_id)
    except Exception as exc:  # noqa: BLE001 - turned into _Unknown, which keeps the session
        raise _Unknown(f"the run could not be read ({type(exc).__name__}: {exc})") from exc


def _judge(instance: Any, doc: SessionDocument, now: float, heartbeat_timeout: float,
           clock: Callable[[], float] = time.time) -> tuple[str, Any] | None:
    """``(reason, run or None)`` when the open session ``doc`` is a candidate orphan; None
    when it is not, or when the instance cannot tell (logged: the session is kept).
    ``now`` is the login node's clock at the read; ``clock`` is the instance's (this
    machine's) for the age of the run's last event."""
    run_id, job_name = doc.run_id, doc.job_name
    if not run_id or not job_name:
        return None
    try:
        return _judge_run(instance, run_id, doc, now, heartbeat_timeout, clock)
    except _Unknown as unknown:
        log.warning("run session %s (run %s) kept: %s; the next reconciliation or its "
                    "dead-man's switch decides", job_name, run_id, unknown.args[0])
        return None


def _judge_run(instance: Any, run_id: str, doc: SessionDocument, now: float,
               heartbeat_timeout: float, clock: Callable[[], float]) -> tuple[str, Any] | None:
    run = _run_of(instance, run_id)
    if run is None:
        return None  # another deployment's run: not ours to judge
    status = getattr(run.status, "value", str(run.status))
    if status in _FINISHED:
        return f"the run is {status} but its allocation is still queued", None
    last = _last_sign_of_life(doc)
    if status not in _UNFINISHED or (last is not None and now - last <= heartbeat_timeout):
        return None
    quiet = _quiet_for(instance, run_id, clock)
    if quiet is not None and quiet <= heartbeat_timeout:
        return None  # the run still writes events: a step that does not use the session
    age = "never" if last is None else f"{now - last:.0f} s ago"
    return f"no supervisor heartbeat since {age} (limit {heartbeat_timeout:g} s)", run


def reconcile_orphaned_slurm_runs(
    instance: Any,
    slurm: SlurmResource | None = None,
    *,
    heartbeat_timeout: float = 600.0,
    dry_run: bool = False,
    prune_closed_after: float | None = 7 * 86400.0,
    io: OrphanIO | None = None,
    clock: Callable[[], float] = time.time,
) -> list[OrphanReport]:
    """Cancel the allocations of orphaned run sessions and mark their runs failed.

    ``heartbeat_timeout``: seconds without a supervisor heartbeat, and without any event of
    the run in the instance, after which an unfinished run's session counts as orphaned.
    Keep it above the sessions' heartbeat_interval and above the longest gap between steps
    that use the session (under the multiprocess executor no process beats between them).
    ``dry_run``: report only. ``prune_closed_after``: session directories (document, logs,
    kept step files) of sessions closed longer ago than this many seconds are removed
    (None keeps them). Returns what was (or would be) done about orphans.
    The cluster is ``slurm`` (or, in tests, ``io``); ``clock`` is this machine's clock.
    """
    if io is None:
        if slurm is None:
            raise ConfigurationError("slurm", slurm, "give the SlurmResource of the cluster")
        io = AgentOrphanIO(slurm)
    candidates, prunable = _sort_sessions(io, instance, heartbeat_timeout, prune_closed_after,
                                          clock)
    if prunable and not dry_run:
        io.prune(prunable)
    if not candidates:
        return []
    snapshot = io.queue([record.doc.job_name for record, _, _ in candidates])
    reports = []
    for record, reason, run in candidates:
        doc = record.doc
        if not snapshot.certain:
            log.warning("run session %s (run %s) kept: the scheduler did not answer (%s); "
                        "the next reconciliation decides", doc.job_name, doc.run_id,
                        snapshot.error or "no answer")
            continue
        live = tuple(
            job_id for job_id, queued in snapshot.queue.items()
            if queued.name == doc.job_name and queued.state.active
        )
        if run is None and not live:
            continue  # finished run, nothing left in the queue
        report = OrphanReport(str(doc.run_id), doc.job_name, live, reason, run is not None)
        reports.append(report)
        if dry_run:
            continue
        _act(instance, io, record.path, report, run)
    return reports


def _sort_sessions(
    io: OrphanIO, instance: Any, heartbeat_timeout: float, prune_closed_after: float | None,
    clock: Callable[[], float],
) -> tuple[list[tuple[SessionRecord, str, Any]], list[str]]:
    """``(candidates, prunable)``: open sessions judged orphaned (with reason and run), and
    directories of sessions closed longer than ``prune_closed_after``."""
    candidates: list[tuple[SessionRecord, str, Any]] = []
    prunable: list[str] = []
    for record in io.sessions():
        doc = record.doc
        if doc.closed_at is not None:
            if prune_closed_after is not None and record.now - doc.closed_at > prune_closed_after:
                prunable.append(record.path.rsplit("/", 1)[0])
            continue
        judged = _judge(instance, doc, record.now, heartbeat_timeout, clock)
        if judged is not None:
            candidates.append((record, *judged))
    return candidates, prunable


def _act(instance: Any, io: OrphanIO, path: str, report: OrphanReport, run: Any) -> None:
    log.warning("orphaned run session %s (run %s): %s; cancelling %s", report.job_name,
                report.run_id, report.reason, ", ".join(report.job_ids) or "nothing queued")
    io.cancel(report.job_name)
    closing = close_session(None, reason=f"orphan: {report.reason}")
    assert isinstance(closing, Change)
    io.apply(path, closing)
    if run is not None:
        instance.report_run_failed(
            run,
            f"dagster-slurm: the run's supervising process stopped ({report.reason}); its Slurm "
            f"allocation(s) {', '.join(report.job_ids) or '(none queued)'} were cancelled",
        )


def build_slurm_orphan_reconcile_sensor(
    slurm: SlurmResource | None = None,
    *,
    resource_key: str | None = None,
    name: str = "slurm_orphan_reconcile_sensor",
    minimum_interval_seconds: int = 60,
    heartbeat_timeout: float = 600.0,
    prune_closed_after: float | None = 7 * 86400.0,
    default_status: Any = None,
) -> Any:
    """A Dagster sensor that runs :func:`reconcile_orphaned_slurm_runs` on every tick.

    Give the cluster as ``slurm`` (a :class:`SlurmResource`), or as ``resource_key`` naming a
    resource of the Definitions (a ``SlurmResource`` or a ``ComputeResource``). Each tick
    reports what it cancelled in its skip message; it never requests runs.
    ``heartbeat_timeout`` and ``prune_closed_after``: see :func:`reconcile_orphaned_slurm_runs`.
    """
    import dagster as dg

    if (slurm is None) == (resource_key is None):
        from dagster_slurm.errors import ConfigurationError

        raise ConfigurationError("slurm", slurm, "give exactly one of slurm= or resource_key=")

    kwargs: dict[str, Any] = {}
    if default_status is not None:
        kwargs["default_status"] = default_status

    @dg.sensor(
        name=name, minimum_interval_seconds=minimum_interval_seconds,
        required_resource_keys={resource_key} if resource_key else None, **kwargs,
    )
    def _sensor(context):  # noqa: ANN001, ANN202 - Dagster reads the annotations at runtime
        cluster = slurm
        if resource_key is not None:
            resource = getattr(context.resources, resource_key)
            cluster = getattr(resource, "slurm", resource)
        assert isinstance(cluster, SlurmResource)
        cluster.acquire()
        try:
            reports = reconcile_orphaned_slurm_runs(
                context.instance, cluster, heartbeat_timeout=heartbeat_timeout,
                prune_closed_after=prune_closed_after,
            )
        finally:
            cluster.release()
        if not reports:
            return dg.SkipReason("no orphaned Slurm run sessions")
        return dg.SkipReason("; ".join(
            f"run {r.run_id}: cancelled {', '.join(r.job_ids) or 'nothing'} ({r.reason})"
            for r in reports
        ))

    return _sensor
