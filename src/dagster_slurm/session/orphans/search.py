"""Find orphaned Slurm work of dead Dagster runs: run sessions and asset-scope jobs.

A session is an orphan when its run is unfinished in the Dagster instance but no process
has written its heartbeat, and the run has written no event, for ``heartbeat_timeout``
seconds (the run's process was SIGKILLed, its machine died), or when its run has finished
but an allocation of the session is still in the queue (a teardown that could not cancel).
An asset-scope job is an orphan on the same two grounds, its heartbeat being the waiting
step's status polls (see :mod:`~dagster_slurm.session.orphans.assets`); a finished run's
jobs are cancelled without failing the run again. Work of runs the instance does not know
is left alone: the base path may be shared with other deployments. Which allocation is the
head does not matter: a run whose head ended while its successor runs, or while its worker
allocations wait for a new head, is judged by its supervisor's signs of life alone (a
worker allocation's submission and a head election count among them), and once judged
orphaned its worker allocations are cancelled with the rest (they carry the session's job
name) and recorded as released. When the instance
cannot be read or squeue does not answer, everything is kept and the reason logged.

Cost: one round trip lists the session documents and the asset jobs' records, one reads
them (heartbeat files included), one squeue covers every candidate's job name; each orphan
costs one scancel (and a session one transaction). Sessions closed longer ago than
``prune_closed_after`` (7 days) are removed in one more round trip, so the scan stays short.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_slurm.config_errors import warn_renamed
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.session.orphans.assets import AssetJobRecord, judge_asset_job
from dagster_slurm.session.orphans.io import (
    AgentOrphanIO,
    OrphanIO,
    OrphanListing,
    SessionRecord,
)
from dagster_slurm.session.orphans.runs import FINISHED as _FINISHED
from dagster_slurm.session.orphans.runs import UNFINISHED as _UNFINISHED
from dagster_slurm.session.orphans.runs import Unknown as _Unknown
from dagster_slurm.session.orphans.runs import quiet_for as _quiet_for
from dagster_slurm.session.orphans.runs import run_of as _run_of
from dagster_slurm.slurm import SqueueRecord
from dagster_slurm.state.election import SchedulerView, workers_await_head
from dagster_slurm.state.schema import SessionDocument
from dagster_slurm.state.transitions import Change, close_session
from dagster_slurm.state.worker_transitions import release_live_workers

__all__ = [
    "AgentOrphanIO", "OrphanIO", "OrphanListing", "OrphanReport", "SessionRecord",
    "build_slurm_orphan_reconcile_sensor", "reconcile_orphaned_slurm_runs",
]

log = logging.getLogger("dagster_slurm.session")


@dataclass(frozen=True)
class OrphanReport:
    """One run session or asset-scope job the reconciliation acted on.

    ``run_id``: the Dagster run. ``job_name``: the session's (or the asset job's) Slurm job
    name. ``job_ids``: its jobs that were still in the queue (and were cancelled).
    ``reason``: why it was judged orphaned. ``run_marked_failed``: whether the run was
    marked failed (by this report; a run is marked once per reconciliation). ``scope``:
    ``"run"`` for a run session, ``"asset"`` for an asset-scope job. ``step_key``: the
    step that submitted an asset-scope job (None for a session).
    """

    run_id: str
    job_name: str
    job_ids: tuple[str, ...]
    reason: str
    run_marked_failed: bool
    scope: str = "run"
    step_key: str | None = None


def _last_sign_of_life(doc: SessionDocument) -> float | None:
    """The latest time a supervisor acted for the session: its heartbeat, the head's
    submission or readiness (a promoted successor's included), a successor's submission,
    a worker allocation's submission, the start of a head election. Which allocation is
    the head, and whether earlier ones ended, does not matter: a run whose first allocation
    ended while its successor runs, or while its worker allocations wait for a new head,
    is judged by these alone."""
    head, successor, election = doc.allocation, doc.successor, doc.election
    times = [doc.heartbeat.at if doc.heartbeat else None,
             head.submitted_at if head else None, head.ready_at if head else None,
             successor.submitted_at if successor else None, doc.created_at,
             election.started_at if election else None,
             *(worker.submitted_at for worker in doc.workers.values()),
             *(submission.submitted_at for submission in doc.worker_submissions.values())]
    known = [float(t) for t in times if t is not None]
    return max(known) if known else None


def judge_session(instance: Any, doc: SessionDocument, now: float, heartbeat_timeout: float,
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
    """Cancel orphaned Slurm work: run sessions' allocations and asset-scope jobs.

    ``heartbeat_timeout``: seconds without a supervisor heartbeat (for an asset-scope job:
    without a status poll by its step), and without any event of the run in the instance,
    after which an unfinished run's session or job counts as orphaned; such a run is
    marked failed. Keep it above the sessions' heartbeat_interval and above the longest
    gap between steps that use the session (under the multiprocess executor no process
    beats between them). Jobs and allocations of finished runs (asset-scope jobs also of
    CANCELING runs) still in the queue are cancelled, the run left as it is.
    ``dry_run``: report only. ``prune_closed_after``: session directories (document, logs,
    kept step files) of sessions closed longer ago than this many seconds are removed
    (None keeps them). Returns what was (or would be) done about orphans.
    The cluster is ``slurm`` (or, in tests, ``io``); ``clock`` is this machine's clock.
    """
    if io is None:
        if slurm is None:
            raise ConfigurationError("slurm", slurm, "give the SlurmResource of the cluster")
        io = AgentOrphanIO(slurm)
    listing = io.listing()
    candidates, prunable = _sort_sessions(listing, instance, heartbeat_timeout,
                                          prune_closed_after, clock)
    jobs = _sort_asset_jobs(listing, instance, heartbeat_timeout, clock)
    if prunable and not dry_run:
        io.prune(prunable)
    if not candidates and not jobs:
        return []
    names = [record.doc.job_name for record, _, _ in candidates]
    names += [record.job_name for record, _, _ in jobs if record.job_name not in names]
    snapshot = io.queue(names)
    if not snapshot.certain:
        log.warning("candidate orphan(s) %s kept: the scheduler did not answer (%s); the "
                    "next reconciliation decides", ", ".join(names), snapshot.error or "no answer")
        return []
    failed: set[str] = set()
    reports = []
    for record, reason, run in candidates:
        doc = record.doc
        live = tuple(
            job_id for job_id, queued in snapshot.queue.items()
            if queued.name == doc.job_name and queued.state.active
        )
        if run is None and not live:
            continue  # finished run, nothing left in the queue
        report = OrphanReport(str(doc.run_id), doc.job_name, live,
                              _with_workers(reason, doc, snapshot, record.now),
                              _fails(run, doc.run_id, failed))
        reports.append(report)
        if not dry_run:
            _act(instance, io, record, report, run)
    for job, reason, run in jobs:
        queued = _queued_job(snapshot, str(job.job_id))
        if queued is None or queued.name != job.job_name or not queued.state.active:
            continue  # the job has left the queue: nothing to cancel, nothing to fail
        report = OrphanReport(job.run_id, job.job_name, (str(job.job_id),), reason,
                              _fails(run, job.run_id, failed), "asset", job.step_key)
        reports.append(report)
        if not dry_run:
            _act_on_job(instance, io, report, run)
    return reports


def _queued_job(snapshot: StatusSnapshot, job_id: str) -> SqueueRecord | None:
    """The queue's line of job ``job_id``; for a job array (a partitioned run), the line of
    one of its tasks that is still active (started as ``<id>_<index>``, or the folded
    pending rest ``<id>_[...]``), so that an array with any task left counts as queued."""
    record = snapshot.queue.get(job_id)
    if record is not None:
        return record
    members = [r for key, r in snapshot.queue.items() if key.startswith(f"{job_id}_")]
    return next((r for r in members if r.state.active), members[0] if members else None)


def _with_workers(reason: str, doc: SessionDocument, snapshot: StatusSnapshot,
                  now: float) -> str:
    """``reason``, saying so when the session's worker allocations wait for a new head."""
    view = SchedulerView.from_squeue(snapshot.queue, observed_at=snapshot.observed_at or now)
    if workers_await_head(doc, view):
        return f"{reason}; its worker allocation(s) wait for a new head"
    return reason


def _fails(run: Any, run_id: str | None, failed: set[str]) -> bool:
    """Whether this report marks ``run`` failed: it is to be failed and no earlier report
    of this reconciliation did (``failed`` collects the run ids)."""
    if run is None or run_id is None or run_id in failed:
        return False
    failed.add(run_id)
    return True


def _sort_asset_jobs(
    listing: OrphanListing, instance: Any, heartbeat_timeout: float,
    clock: Callable[[], float],
) -> list[tuple[AssetJobRecord, str, Any]]:
    """Asset-scope jobs judged orphaned, with reason and run (to fail, or None)."""
    candidates: list[tuple[AssetJobRecord, str, Any]] = []
    for record in listing.asset_jobs:
        try:
            judged = judge_asset_job(instance, record, heartbeat_timeout, clock)
        except _Unknown as unknown:
            log.warning("asset job %s (job %s, run %s) kept: %s; the next reconciliation or "
                        "its dead-man's switch decides", record.job_name, record.job_id,
                        record.run_id, unknown.args[0])
            continue
        if judged is not None:
            candidates.append((record, *judged))
    return candidates


def _sort_sessions(
    listing: OrphanListing, instance: Any, heartbeat_timeout: float,
    prune_closed_after: float | None, clock: Callable[[], float],
) -> tuple[list[tuple[SessionRecord, str, Any]], list[str]]:
    """``(candidates, prunable)``: open sessions judged orphaned (with reason and run), and
    directories of sessions closed longer than ``prune_closed_after``."""
    candidates: list[tuple[SessionRecord, str, Any]] = []
    prunable: list[str] = []
    for record in listing.sessions:
        doc = record.doc
        if doc.closed_at is not None:
            if prune_closed_after is not None and record.now - doc.closed_at > prune_closed_after:
                prunable.append(record.path.rsplit("/", 1)[0])
            continue
        judged = judge_session(instance, doc, record.now, heartbeat_timeout, clock)
        if judged is not None:
            candidates.append((record, *judged))
    return candidates, prunable


def _act(instance: Any, io: OrphanIO, record: SessionRecord, report: OrphanReport,
         run: Any) -> None:
    log.warning("orphaned run session %s (run %s): %s; cancelling %s", report.job_name,
                report.run_id, report.reason, ", ".join(report.job_ids) or "nothing queued")
    io.cancel(report.job_name)
    closing = close_session(None, reason=f"orphan: {report.reason}")
    assert isinstance(closing, Change)
    io.apply(record.path, closing)
    released = release_live_workers(record.doc)  # cancelled with the session's job name
    if released is not None:
        io.apply(record.path, released)
    if report.run_marked_failed:
        instance.report_run_failed(
            run,
            f"dagster-slurm: the run's supervising process stopped ({report.reason}); its Slurm "
            f"allocation(s) {', '.join(report.job_ids) or '(none queued)'} were cancelled",
        )


def _act_on_job(instance: Any, io: OrphanIO, report: OrphanReport, run: Any) -> None:
    log.warning("orphaned asset job %s (job %s, run %s, step %s): %s; cancelling it",
                report.job_name, ", ".join(report.job_ids), report.run_id, report.step_key,
                report.reason)
    io.cancel_jobs(report.job_ids)
    if report.run_marked_failed:
        instance.report_run_failed(
            run,
            f"dagster-slurm: the step {report.step_key} stopped polling its Slurm job "
            f"({report.reason}); job {', '.join(report.job_ids)} was cancelled",
        )


_HELD: set[tuple[int, int]] = set()
_HELD_LOCK = threading.Lock()


def _hold(cluster: SlurmResource) -> None:
    """Keep ``cluster``'s connection of this process open from the first tick on.

    A sensor ticks in the same long-lived process (the code server) every minute or so;
    closing the connection after each tick would log in again at every tick (2,880 logins
    a day at 30 s, which sites count and ban). The connection is one per process and
    settings, and ends with the process."""
    key = (os.getpid(), id(cluster))
    with _HELD_LOCK:
        if key in _HELD:
            return
        _HELD.add(key)
    cluster.acquire()


def build_slurm_orphan_reconcile_sensor(
    slurm: SlurmResource | None = None,
    *,
    slurm_resource: SlurmResource | None = None,
    resource_key: str | None = None,
    name: str = "slurm_orphan_reconcile_sensor",
    minimum_interval_seconds: int = 60,
    heartbeat_timeout: float = 600.0,
    prune_closed_after: float | None = 7 * 86400.0,
    default_status: Any = None,
) -> Any:
    """A Dagster sensor that runs :func:`reconcile_orphaned_slurm_runs` on every tick.

    It covers run sessions and asset-scope jobs alike. Give the cluster as ``slurm`` (a
    :class:`SlurmResource`), or as ``resource_key`` naming a resource of the Definitions (a
    ``SlurmResource`` or a ``ComputeResource``). Each tick reports what it cancelled in its
    skip message; it never requests runs.
    ``heartbeat_timeout`` and ``prune_closed_after``: see :func:`reconcile_orphaned_slurm_runs`.
    ``slurm_resource``: the published package's name of ``slurm``, accepted with a
    deprecation warning (giving both is an error).
    """
    import dagster as dg

    if slurm_resource is not None:
        warn_renamed("build_slurm_orphan_reconcile_sensor(slurm_resource=...)", "slurm=")
        if slurm is not None:
            raise ConfigurationError(
                "slurm_resource", slurm_resource,
                "given together with slurm; slurm_resource is the published package's name "
                "of slurm: give only slurm",
            )
        slurm = slurm_resource

    if (slurm is None) == (resource_key is None):
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
        _hold(cluster)
        reports = reconcile_orphaned_slurm_runs(
            context.instance, cluster, heartbeat_timeout=heartbeat_timeout,
            prune_closed_after=prune_closed_after,
        )
        if not reports:
            return dg.SkipReason("no orphaned Slurm run sessions or asset jobs")
        return dg.SkipReason("; ".join(
            f"run {r.run_id}: cancelled {', '.join(r.job_ids) or 'nothing'}"
            f"{f' of step {r.step_key}' if r.step_key else ''} ({r.reason})"
            for r in reports
        ))

    return _sensor
