"""Orphan judging: an instance that cannot be read never makes a session an orphan."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from dagster_slurm.session.orphans import _judge
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import SessionDocument

NOW = 1_000_000.0


class FakeInstance:
    def __init__(self, status: str = "STARTED", *, run_fails: bool = False,
                 events_fail: bool = False, last_event_at: float | None = None) -> None:
        self.run = SimpleNamespace(status=SimpleNamespace(value=status))
        self.run_fails = run_fails
        self.events_fail = events_fail
        self.last_event_at = last_event_at

    def get_run_by_id(self, run_id: str) -> Any:
        if self.run_fails:
            raise RuntimeError("run storage unavailable")
        return self.run

    def get_records_for_run(self, run_id: str, ascending: bool, limit: int) -> Any:
        if self.events_fail:
            raise RuntimeError("event log unavailable")
        if self.last_event_at is None:
            return SimpleNamespace(records=[])
        entry = SimpleNamespace(timestamp=self.last_event_at)
        return SimpleNamespace(records=[SimpleNamespace(event_log_entry=entry)])


def _doc(heartbeat_at: float) -> SessionDocument:
    doc = tr.document({"run_id": "r-1", "job_name": "dsr-r-1-abcd",
                       "heartbeat": {"host": "h", "pid": 1, "at": heartbeat_at}})
    assert doc is not None
    return doc


def test_stale_heartbeat_and_no_events_make_an_orphan() -> None:
    judged = _judge(FakeInstance(), _doc(NOW - 700), NOW, 600)
    assert judged is not None
    reason, run = judged
    assert "no supervisor heartbeat since 700 s ago" in reason and run is not None


def test_fresh_heartbeat_is_not_an_orphan() -> None:
    assert _judge(FakeInstance(), _doc(NOW - 10), NOW, 600) is None


def test_recent_run_events_are_not_an_orphan() -> None:
    instance = FakeInstance(last_event_at=time.time() - 5)
    assert _judge(instance, _doc(NOW - 700), NOW, 600) is None


@pytest.mark.parametrize(
    ("instance", "words"),
    [
        (FakeInstance(run_fails=True), "run storage unavailable"),
        (FakeInstance(events_fail=True), "event log unavailable"),
    ],
)
def test_unreadable_instance_keeps_the_session_and_logs_why(
    instance: FakeInstance, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.session"):
        assert _judge(instance, _doc(NOW - 700), NOW, 600) is None
    (record,) = caplog.records
    assert "dsr-r-1-abcd" in record.getMessage() and "kept" in record.getMessage()
    assert words in record.getMessage()


def test_finished_run_with_unreadable_events_is_still_judged_by_its_status() -> None:
    judged = _judge(FakeInstance("SUCCESS", events_fail=True), _doc(NOW - 700), NOW, 600)
    assert judged is not None and judged[1] is None and "SUCCESS" in judged[0]


# -- the whole reconciliation against an in-memory cluster and a fake clock --------------------
from dagster_slurm.scheduler.client import StatusSnapshot  # noqa: E402
from dagster_slurm.session.orphans import (  # noqa: E402
    SessionRecord,
    reconcile_orphaned_slurm_runs,
)
from dagster_slurm.slurm.parsers import SqueueRecord  # noqa: E402
from dagster_slurm.slurm.states import JobState  # noqa: E402
from dagster_slurm.state import MemoryStateStore  # noqa: E402


class ReportingInstance(FakeInstance):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed: list[str] = []

    def report_run_failed(self, run: Any, message: str) -> None:
        self.failed.append(message)


def _queued(job_id: str, name: str) -> SqueueRecord:
    return SqueueRecord(
        job_id=job_id, name=name, state=JobState.RUNNING, raw_state="RUNNING", reason=None,
        time_left_seconds=60.0, time_limit_seconds=600.0, start_time=None, end_time=None,
        node_list="c1", nodes=("c1",), num_nodes=1, tres_per_node=None, partition="cpu",
        cpus=2, min_memory_bytes=None, elapsed_seconds=1.0, comment="tok",
    )


class FakeOrphanCluster:
    """Session documents in memory stores, a scripted squeue, and a record of actions."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.stores: dict[str, MemoryStateStore] = {}
        self.jobs: dict[str, str] = {}  # job id -> job name
        self.answers = True
        self.cancelled: list[str] = []
        self.pruned: list[str] = []

    def add(self, name: str, **fields: Any) -> str:
        path = f"/base/sessions/{name}/allocation.json"
        store = MemoryStateStore({"schema_version": 1, "job_name": f"dsr-{name}",
                                  "run_id": name, **fields}, clock=lambda: self.now)
        store.transact([])  # creates the document
        self.stores[path] = store
        return path

    def sessions(self) -> list[SessionRecord]:
        out = []
        for path, store in self.stores.items():
            doc = tr.document(store.snapshot().doc)
            assert doc is not None
            out.append(SessionRecord(path, doc, self.now))
        return out

    def queue(self, job_names: Any) -> StatusSnapshot:
        if not self.answers:
            return StatusSnapshot(self.now, False, {}, {}, {}, (), "squeue: timed out")
        queue = {j: _queued(j, n) for j, n in self.jobs.items() if n in job_names}
        return StatusSnapshot(self.now, True, queue, {}, {}, ())

    def cancel(self, job_name: str) -> None:
        self.cancelled.append(job_name)

    def apply(self, path: str, change: tr.Change) -> None:
        assert self.stores[path].transact(change.patch).ok

    def prune(self, session_dirs: Any) -> None:
        self.pruned.extend(session_dirs)


def _beat(at: float) -> dict[str, Any]:
    return {"heartbeat": {"host": "h", "pid": 1, "at": at}}


def test_a_silent_session_is_cancelled_closed_and_its_run_failed() -> None:
    cluster = FakeOrphanCluster(NOW)
    path = cluster.add("run-a", **_beat(NOW - 700))
    cluster.jobs["5"] = "dsr-run-a"
    instance = ReportingInstance()
    (report,) = reconcile_orphaned_slurm_runs(instance, io=cluster, heartbeat_timeout=600,
                                              clock=lambda: NOW)
    assert report.job_ids == ("5",) and report.run_marked_failed
    assert cluster.cancelled == ["dsr-run-a"]
    doc = cluster.stores[path].snapshot().doc or {}
    assert doc["closed_at"] == NOW and doc["closed_reason"].startswith("orphan: no supervisor")
    assert "were cancelled" in instance.failed[0]


def test_a_live_session_and_a_dry_run_change_nothing() -> None:
    cluster = FakeOrphanCluster(NOW)
    cluster.add("fresh", **_beat(NOW - 30))
    stale = cluster.add("stale", **_beat(NOW - 700))
    instance = ReportingInstance()
    reports = reconcile_orphaned_slurm_runs(instance, io=cluster, heartbeat_timeout=600,
                                            dry_run=True, clock=lambda: NOW)
    assert [r.job_name for r in reports] == ["dsr-stale"]
    assert cluster.cancelled == [] and instance.failed == []
    assert (cluster.stores[stale].snapshot().doc or {}).get("closed_at") is None


def test_a_scheduler_that_does_not_answer_keeps_every_session() -> None:
    cluster = FakeOrphanCluster(NOW)
    cluster.add("stale", **_beat(NOW - 700))
    cluster.answers = False
    instance = ReportingInstance()
    assert reconcile_orphaned_slurm_runs(instance, io=cluster, heartbeat_timeout=600,
                                         clock=lambda: NOW) == []
    assert cluster.cancelled == [] and instance.failed == []


def test_old_closed_sessions_are_pruned_and_recent_ones_kept() -> None:
    cluster = FakeOrphanCluster(NOW)
    cluster.add("old", closed_at=NOW - 8 * 86400, **_beat(NOW - 8 * 86400))
    cluster.add("recent", closed_at=NOW - 60, **_beat(NOW - 60))
    reconcile_orphaned_slurm_runs(ReportingInstance(), io=cluster, clock=lambda: NOW)
    assert cluster.pruned == ["/base/sessions/old"]


def test_a_finished_run_with_a_job_still_queued_is_cancelled_without_failing_the_run() -> None:
    cluster = FakeOrphanCluster(NOW)
    cluster.add("done", **_beat(NOW - 5))
    cluster.jobs["9"] = "dsr-done"
    instance = ReportingInstance("SUCCESS")
    (report,) = reconcile_orphaned_slurm_runs(instance, io=cluster, clock=lambda: NOW)
    assert report.job_ids == ("9",) and not report.run_marked_failed
    assert cluster.cancelled == ["dsr-done"] and instance.failed == []


def test_the_quiet_time_of_the_run_is_judged_by_the_injected_clock() -> None:
    cluster = FakeOrphanCluster(NOW)
    cluster.add("busy", **_beat(NOW - 700))
    instance = ReportingInstance(last_event_at=5000.0)
    assert reconcile_orphaned_slurm_runs(instance, io=cluster, heartbeat_timeout=600,
                                         dry_run=True, clock=lambda: 5100.0) == []
    assert len(reconcile_orphaned_slurm_runs(instance, io=cluster, heartbeat_timeout=600,
                                             dry_run=True, clock=lambda: 6000.0)) == 1
