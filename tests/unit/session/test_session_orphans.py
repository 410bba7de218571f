"""Orphan judging: an instance that cannot be read never makes a session an orphan."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from dagster_slurm.session.orphans.search import judge_session
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
    judged = judge_session(FakeInstance(), _doc(NOW - 700), NOW, 600)
    assert judged is not None
    reason, run = judged
    assert "no supervisor heartbeat since 700 s ago" in reason and run is not None


def test_fresh_heartbeat_is_not_an_orphan() -> None:
    assert judge_session(FakeInstance(), _doc(NOW - 10), NOW, 600) is None


def _relayed(heartbeat_at: float) -> SessionDocument:
    """A run whose first allocation ended (history, REPLACED) and whose successor is the head."""
    doc = tr.document({
        "run_id": "r-1", "job_name": "dsr-r-1-abcd",
        "heartbeat": {"host": "h", "pid": 1, "at": heartbeat_at},
        "allocation": {"kind": "head", "job_id": "12", "token": "t2", "status": "submitted",
                       "submitted_at": NOW - 3000, "ready_at": NOW - 2000,
                       "promoted_from": "11"},
        "history": {"11": {"kind": "head", "job_id": "11", "token": "t1",
                           "status": "submitted", "final_state": "REPLACED",
                           "submitted_at": NOW - 9000}},
    })
    assert doc is not None
    return doc


def test_a_run_whose_first_allocation_ended_but_whose_successor_runs_is_not_an_orphan() -> None:
    assert judge_session(FakeInstance(), _relayed(NOW - 10), NOW, 600) is None


def test_a_relayed_run_with_a_stale_supervisor_is_still_an_orphan() -> None:
    judged = judge_session(FakeInstance(), _relayed(NOW - 2500), NOW, 600)
    assert judged is not None and "no supervisor heartbeat" in judged[0]


def test_recent_run_events_are_not_an_orphan() -> None:
    instance = FakeInstance(last_event_at=time.time() - 5)
    assert judge_session(instance, _doc(NOW - 700), NOW, 600) is None


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
        assert judge_session(instance, _doc(NOW - 700), NOW, 600) is None
    (record,) = caplog.records
    assert "dsr-r-1-abcd" in record.getMessage() and "kept" in record.getMessage()
    assert words in record.getMessage()


def test_finished_run_with_unreadable_events_is_still_judged_by_its_status() -> None:
    judged = judge_session(FakeInstance("SUCCESS", events_fail=True), _doc(NOW - 700), NOW, 600)
    assert judged is not None and judged[1] is None and "SUCCESS" in judged[0]


# -- the whole reconciliation against an in-memory cluster and a fake clock --------------------
from dagster_slurm.scheduler.client import StatusSnapshot  # noqa: E402
from dagster_slurm.session.orphans.assets import AssetJobRecord  # noqa: E402
from dagster_slurm.session.orphans.search import (  # noqa: E402
    OrphanListing,
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
        self.asset_jobs: list[AssetJobRecord] = []
        self.queries: list[list[str]] = []

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

    def listing(self) -> OrphanListing:
        return OrphanListing(self.sessions(), list(self.asset_jobs))

    def queue(self, job_names: Any) -> StatusSnapshot:
        self.queries.append(list(job_names))
        if not self.answers:
            return StatusSnapshot(self.now, False, {}, {}, {}, (), "squeue: timed out")
        queue = {j: _queued(j, n) for j, n in self.jobs.items() if n in job_names}
        return StatusSnapshot(self.now, True, queue, {}, {}, ())

    def cancel(self, job_name: str) -> None:
        self.cancelled.append(job_name)

    def cancel_jobs(self, job_ids: Any) -> None:
        self.cancelled.extend(f"job {j}" for j in job_ids)

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


# -- asset-scope jobs: the same reconciliation, the same single squeue ---------------------
from dagster_slurm.session.orphans.assets import (  # noqa: E402
    is_record_path,
    parse_heartbeat,
    parse_record,
)


class RunsInstance:
    """Several runs by id (status, time of the last event); unknown ids are None."""

    def __init__(self, runs: dict[str, str], *, last_event_at: float | None = None,
                 fails: bool = False) -> None:
        self.runs = {rid: SimpleNamespace(run_id=rid, status=SimpleNamespace(value=status))
                     for rid, status in runs.items()}
        self.last_event_at = last_event_at
        self.fails = fails
        self.failed: list[tuple[str, str]] = []

    def get_run_by_id(self, run_id: str) -> Any:
        if self.fails:
            raise RuntimeError("run storage unavailable")
        return self.runs.get(run_id)

    def get_records_for_run(self, run_id: str, ascending: bool, limit: int) -> Any:
        if self.last_event_at is None:
            return SimpleNamespace(records=[])
        entry = SimpleNamespace(timestamp=self.last_event_at)
        return SimpleNamespace(records=[SimpleNamespace(event_log_entry=entry)])

    def report_run_failed(self, run: Any, message: str) -> None:
        self.failed.append((run.run_id, message))


def _asset_job(cluster: FakeOrphanCluster, run_id: str, step: str, job_id: str | None, *,
               heartbeat_at: float | None, submitted_at: float | None = None,
               queued: bool = True) -> AssetJobRecord:
    name = f"dsl-{run_id[:8]}-{step}"
    record = AssetJobRecord(f"/base/runs/{run_id}/{step}/inv1/job.json", run_id, step, name,
                            job_id, submitted_at if submitted_at is not None else NOW - 3600,
                            heartbeat_at, cluster.now)
    cluster.asset_jobs.append(record)
    if queued and job_id is not None:
        cluster.jobs[job_id] = name
    return record


def _reconcile(instance: Any, cluster: FakeOrphanCluster, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("heartbeat_timeout", 600)
    return reconcile_orphaned_slurm_runs(instance, io=cluster, clock=lambda: NOW, **kwargs)


@pytest.mark.parametrize("status", ["FAILURE", "SUCCESS", "CANCELED", "CANCELING"])
def test_an_ended_runs_asset_job_is_cancelled_by_id_without_failing_the_run(status: str) -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-ended-1", "train", "41", heartbeat_at=NOW - 2)
    instance = RunsInstance({"run-ended-1": status})
    (report,) = _reconcile(instance, cluster)
    assert (report.scope, report.step_key, report.job_ids) == ("asset", "train", ("41",))
    assert not report.run_marked_failed and instance.failed == []
    assert f"the run is {status}" in report.reason
    assert cluster.cancelled == ["job 41"]


def test_a_polled_asset_job_of_a_running_run_is_kept_without_asking_the_scheduler() -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-live-01", "train", "42", heartbeat_at=NOW - 9)
    assert _reconcile(RunsInstance({"run-live-01": "STARTED"}), cluster) == []
    assert cluster.queries == [] and cluster.cancelled == []


def test_a_silent_step_gets_its_jobs_cancelled_and_its_run_failed_once() -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-dead-01", "a", "43", heartbeat_at=NOW - 700)
    _asset_job(cluster, "run-dead-01", "b", "44", heartbeat_at=None, submitted_at=NOW - 900)
    instance = RunsInstance({"run-dead-01": "STARTED"})
    reports = _reconcile(instance, cluster)
    assert [r.job_ids for r in reports] == [("43",), ("44",)]
    assert "no status poll by its step since 700 s ago (limit 600 s)" in reports[0].reason
    assert "since 900 s ago" in reports[1].reason  # no heartbeat: the submission counts
    assert [r.run_marked_failed for r in reports] == [True, False]
    assert [rid for rid, _ in instance.failed] == ["run-dead-01"]
    assert "step a stopped polling" in instance.failed[0][1]
    assert cluster.cancelled == ["job 43", "job 44"]


def test_a_silent_step_of_a_run_that_still_writes_events_is_kept() -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-busy-01", "a", "45", heartbeat_at=NOW - 700)
    assert _reconcile(RunsInstance({"run-busy-01": "STARTED"}, last_event_at=NOW - 30),
                      cluster) == []
    assert cluster.cancelled == []


def test_the_heartbeat_age_is_judged_by_the_injected_clock() -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-clock-1", "a", "46", heartbeat_at=5000.0)
    instance = RunsInstance({"run-clock-1": "STARTED"})
    assert reconcile_orphaned_slurm_runs(instance, io=cluster, heartbeat_timeout=600,
                                         dry_run=True, clock=lambda: 5100.0) == []
    assert len(reconcile_orphaned_slurm_runs(instance, io=cluster, heartbeat_timeout=600,
                                             dry_run=True, clock=lambda: 6000.0)) == 1


def test_asset_jobs_of_runs_the_instance_does_not_know_are_left_alone() -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "elsewhere-1", "a", "47", heartbeat_at=NOW - 7000)
    assert _reconcile(RunsInstance({}), cluster) == []
    assert cluster.queries == [] and cluster.cancelled == []


def test_an_unreadable_instance_keeps_asset_jobs_and_logs_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-dark-01", "a", "48", heartbeat_at=NOW - 7000)
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.session"):
        assert _reconcile(RunsInstance({"run-dark-01": "FAILURE"}, fails=True), cluster) == []
    assert cluster.cancelled == []
    message = caplog.records[0].getMessage()
    assert "kept" in message and "run storage unavailable" in message and "48" in message


def test_a_scheduler_that_does_not_answer_keeps_every_asset_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-ended-2", "a", "49", heartbeat_at=NOW)
    cluster.answers = False
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.session"):
        assert _reconcile(RunsInstance({"run-ended-2": "FAILURE"}), cluster) == []
    assert cluster.cancelled == []
    assert "did not answer" in caplog.records[0].getMessage()


def test_a_dry_run_reports_asset_jobs_and_changes_nothing() -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-dead-02", "a", "50", heartbeat_at=NOW - 700)
    instance = RunsInstance({"run-dead-02": "STARTED"})
    (report,) = _reconcile(instance, cluster, dry_run=True)
    assert report.run_marked_failed and report.job_ids == ("50",)
    assert cluster.cancelled == [] and instance.failed == []


def test_only_the_records_own_job_is_cancelled_not_a_retry_of_the_same_name() -> None:
    cluster = FakeOrphanCluster(NOW)
    first = _asset_job(cluster, "run-retry-1", "a", "51", heartbeat_at=NOW - 700, queued=False)
    cluster.jobs["52"] = first.job_name  # the step's retry: same run, same step, same name
    _asset_job(cluster, "run-retry-1", "a", "52", heartbeat_at=NOW - 1, queued=True)
    assert _reconcile(RunsInstance({"run-retry-1": "STARTED"}), cluster) == []
    assert cluster.cancelled == []


def test_a_record_without_job_id_is_left_to_the_jobs_own_switch() -> None:
    cluster = FakeOrphanCluster(NOW)
    _asset_job(cluster, "run-doubt-1", "a", None, heartbeat_at=NOW - 7000)
    assert _reconcile(RunsInstance({"run-doubt-1": "FAILURE"}), cluster) == []
    assert cluster.queries == []


def test_sessions_and_asset_jobs_share_one_squeue() -> None:
    cluster = FakeOrphanCluster(NOW)
    cluster.add("run-mixed-1", **_beat(NOW - 700))
    cluster.jobs["60"] = "dsr-run-mixed-1"
    _asset_job(cluster, "run-mixed-1", "a", "61", heartbeat_at=NOW - 700)
    instance = RunsInstance({"run-mixed-1": "STARTED"})
    reports = _reconcile(instance, cluster)
    assert cluster.queries == [["dsr-run-mixed-1", "dsl-run-mixe-a"]]
    assert [(r.scope, r.job_ids) for r in reports] == [("run", ("60",)), ("asset", ("61",))]
    assert [r.run_marked_failed for r in reports] == [True, False]
    assert len(instance.failed) == 1
    assert cluster.cancelled == ["dsr-run-mixed-1", "job 61"]


def test_records_are_recognised_by_place_and_content() -> None:
    root = "/b/runs"
    assert is_record_path("/b/runs/r1/step/inv/job.json", root)
    assert not is_record_path("/b/runs/r1/step/job.json", root)
    assert not is_record_path("/b/sessions/s/jobs/1/job.json", root)
    doc = {"job": {"run_id": "r1", "step_key": "s", "job_name": "dsl-r1-s", "job_id": "7",
                   "submitted_at": 10.0, "token": "t"}}
    record = parse_record("/b/runs/r1/s/inv/job.json", doc, b"12.5 host 3 4\n", 20.0)
    assert record is not None and record.heartbeat_at == 12.5 and record.job_id == "7"
    assert record.heartbeat_path == "/b/runs/r1/s/inv/heartbeat"
    assert parse_record("/x/job.json", {"job": {"token": "t", "job_id": "7"}}, None, 0) is None
    assert parse_heartbeat("garbage") is None and parse_heartbeat(None) is None


# -- worker allocations waiting for a head: judged like a run with a published successor ------
def _awaiting_head(heartbeat_at: float, **extra: Any) -> dict[str, Any]:
    """A run whose head ended (history) while its worker allocations 31, 32 wait for a new
    one; worker 30 was released earlier."""
    worker = {"role": "worker", "released": False, "submitted_at": NOW - 5000}
    return {
        **_beat(heartbeat_at),
        "history": {"11": {"kind": "head", "job_id": "11", "token": "t1", "status": "submitted",
                           "final_state": "TIMEOUT", "submitted_at": NOW - 9000}},
        "workers": {"30": {**worker, "job_id": "30", "released": True},
                    "31": {**worker, "job_id": "31"}, "32": {**worker, "job_id": "32"}},
        **extra,
    }


def test_a_run_whose_workers_wait_for_a_head_under_a_live_supervisor_is_not_an_orphan() -> None:
    cluster = FakeOrphanCluster(NOW)
    cluster.add("run-wait-1", **_awaiting_head(NOW - 10))
    cluster.jobs.update({"31": "dsr-run-wait-1", "32": "dsr-run-wait-1"})
    assert _reconcile(RunsInstance({"run-wait-1": "STARTED"}), cluster) == []
    assert cluster.cancelled == []


@pytest.mark.parametrize("sign", ["election", "worker_submission"])
def test_a_recent_election_or_worker_submission_is_a_sign_of_life(sign: str) -> None:
    extra: dict[str, Any] = (
        {"election": {"term": 2, "candidate": "31", "claimed_by": "h:1",
                      "started_at": NOW - 30, "expires_at": NOW + 90}}
        if sign == "election" else
        {"worker_submissions": {"wt-9": {"token": "wt-9", "status": "submitting",
                                         "submitted_at": NOW - 30}}})
    cluster = FakeOrphanCluster(NOW)
    cluster.add("run-wait-2", **_awaiting_head(NOW - 2000, **extra))
    cluster.jobs.update({"31": "dsr-run-wait-2"})
    assert _reconcile(RunsInstance({"run-wait-2": "STARTED"}), cluster) == []


def test_a_silent_run_whose_workers_wait_for_a_head_is_recovered_workers_included() -> None:
    cluster = FakeOrphanCluster(NOW)
    path = cluster.add("run-wait-3", **_awaiting_head(NOW - 2000))
    cluster.jobs.update({"31": "dsr-run-wait-3", "32": "dsr-run-wait-3"})
    instance = RunsInstance({"run-wait-3": "STARTED"})
    (report,) = _reconcile(instance, cluster)
    assert report.job_ids == ("31", "32") and report.run_marked_failed
    assert "no supervisor heartbeat" in report.reason
    assert "worker allocation(s) wait for a new head" in report.reason
    assert cluster.cancelled == ["dsr-run-wait-3"]  # the session's job name: workers too
    doc = cluster.stores[path].snapshot().doc or {}
    assert doc["closed_at"] == NOW
    assert all(doc["workers"][w]["released"] for w in ("30", "31", "32"))
