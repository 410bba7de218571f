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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dagster_slurm.agent import exec_op, read_op, txn_op
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.session.paths import SESSIONS_DIR
from dagster_slurm.state.transitions import Change, close_session

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


def _session_documents(slurm: SlurmResource) -> Iterator[tuple[str, dict[str, Any], float]]:
    """``(document path, document, login-node time)`` of every session under the base path."""
    agent = slurm.agent()
    root = f"{slurm.base_path()}/{SESSIONS_DIR}"
    found = agent.run(exec_op(
        ["find", root, "-mindepth", "2", "-maxdepth", "2", "-name", "allocation.json"], timeout=60
    ))
    paths = [p for p in found.stdout.splitlines() if p.strip()]
    if not paths:
        return
    with agent.batch() as batch:
        reads = [batch.add(read_op(path)) for path in paths]
    now = batch.response.now if batch.response else 0.0
    for path, pending in zip(paths, reads, strict=True):
        try:
            result = pending.result()
        except DagsterSlurmError as exc:
            log.warning("skipping unreadable session document %s: %s", path, exc)
            continue
        if result.doc:
            yield path, result.doc, now


def _last_sign_of_life(doc: dict[str, Any]) -> float | None:
    heartbeat = doc.get("heartbeat") or {}
    times = [heartbeat.get("at"), (doc.get("allocation") or {}).get("submitted_at"), doc.get("created_at")]
    known = [float(t) for t in times if isinstance(t, (int, float))]
    return max(known) if known else None


class _Unknown(Exception):
    """The instance could not say what a session's run is doing; ``args[0]`` says why."""


def _quiet_for(instance: Any, run_id: str) -> float | None:
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
    return max(0.0, time.time() - records[0].event_log_entry.timestamp)


def _run_of(instance: Any, run_id: str) -> Any:
    """The instance's run ``run_id`` (None when the instance does not know it); raises
    :class:`_Unknown` when the instance cannot be read."""
    try:
        return instance.get_run_by_id(run_id)
    except Exception as exc:  # noqa: BLE001 - turned into _Unknown, which keeps the session
        raise _Unknown(f"the run could not be read ({type(exc).__name__}: {exc})") from exc


def _judge(instance: Any, doc: dict[str, Any], now: float,
           heartbeat_timeout: float) -> tuple[str, Any] | None:
    """``(reason, run or None)`` when the open session ``doc`` is a candidate orphan; None
    when it is not, or when the instance cannot tell (logged: the session is kept)."""
    run_id, job_name = doc.get("run_id"), doc.get("job_name")
    if not run_id or not job_name:
        return None
    try:
        return _judge_run(instance, run_id, doc, now, heartbeat_timeout)
    except _Unknown as unknown:
        log.warning("run session %s (run %s) kept: %s; the next reconciliation or its "
                    "dead-man's switch decides", job_name, run_id, unknown.args[0])
        return None


def _judge_run(instance: Any, run_id: str, doc: dict[str, Any], now: float,
               heartbeat_timeout: float) -> tuple[str, Any] | None:
    run = _run_of(instance, run_id)
    if run is None:
        return None  # another deployment's run: not ours to judge
    status = getattr(run.status, "value", str(run.status))
    if status in _FINISHED:
        return f"the run is {status} but its allocation is still queued", None
    last = _last_sign_of_life(doc)
    if status not in _UNFINISHED or (last is not None and now - last <= heartbeat_timeout):
        return None
    quiet = _quiet_for(instance, run_id)
    if quiet is not None and quiet <= heartbeat_timeout:
        return None  # the run still writes events: a step that does not use the session
    age = "never" if last is None else f"{now - last:.0f} s ago"
    return f"no supervisor heartbeat since {age} (limit {heartbeat_timeout:g} s)", run


def reconcile_orphaned_slurm_runs(
    instance: Any,
    slurm: SlurmResource,
    *,
    heartbeat_timeout: float = 600.0,
    dry_run: bool = False,
    prune_closed_after: float | None = 7 * 86400.0,
) -> list[OrphanReport]:
    """Cancel the allocations of orphaned run sessions and mark their runs failed.

    ``heartbeat_timeout``: seconds without a supervisor heartbeat, and without any event of
    the run in the instance, after which an unfinished run's session counts as orphaned.
    Keep it above the sessions' heartbeat_interval and above the longest gap between steps
    that use the session (under the multiprocess executor no process beats between them).
    ``dry_run``: report only. ``prune_closed_after``: session directories (document, logs,
    kept step files) of sessions closed longer ago than this many seconds are removed
    (None keeps them). Returns what was (or would be) done about orphans.
    """
    candidates: list[tuple[str, dict[str, Any], str, Any]] = []
    prunable: list[str] = []
    for path, doc, now in _session_documents(slurm):
        closed_at = doc.get("closed_at")
        if isinstance(closed_at, (int, float)):
            if prune_closed_after is not None and now - closed_at > prune_closed_after:
                prunable.append(path.rsplit("/", 1)[0])
            continue
        judged = _judge(instance, doc, now, heartbeat_timeout)
        if judged is not None:
            candidates.append((path, doc, *judged))
    if prunable and not dry_run:
        _prune(slurm, prunable)
    if not candidates:
        return []
    scheduler = slurm.scheduler()
    snapshot = scheduler.status([doc["job_name"] for _, doc, _, _ in candidates], accounting=False)
    reports = []
    for path, doc, reason, run in candidates:
        live = tuple(
            job_id for job_id, record in snapshot.queue.items()
            if record.name == doc["job_name"] and record.state.active
        )
        if run is None and not live:
            continue  # finished run, nothing left in the queue
        report = OrphanReport(doc["run_id"], doc["job_name"], live, reason, run is not None)
        reports.append(report)
        if dry_run:
            continue
        _act(instance, slurm, path, doc, report, run)
    return reports


def _prune(slurm: SlurmResource, session_dirs: list[str]) -> None:
    """Remove closed sessions' directories, in one round trip."""
    from dagster_slurm.agent import remove_op

    root = f"{slurm.base_path()}/{SESSIONS_DIR}"
    with slurm.agent().batch() as batch:
        removals = [batch.add(remove_op(path, root=root)) for path in session_dirs]
    for path, removal in zip(session_dirs, removals, strict=True):
        try:
            removal.result()
            log.info("removed closed run session %s", path)
        except DagsterSlurmError as exc:
            log.warning("could not remove closed run session %s: %s", path, exc)


def _act(instance: Any, slurm: SlurmResource, path: str, doc: dict[str, Any],
         report: OrphanReport, run: Any) -> None:
    log.warning("orphaned run session %s (run %s): %s; cancelling %s", report.job_name,
                report.run_id, report.reason, ", ".join(report.job_ids) or "nothing queued")
    slurm.scheduler().cancel(job_name=report.job_name)
    lock = path.rsplit("/", 1)[0] + "/lock"
    closing = close_session(None, reason=f"orphan: {report.reason}")
    assert isinstance(closing, Change)
    slurm.agent().run(txn_op(path, lock, closing.patch))
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
