"""Orphan judging: an instance that cannot be read never makes a session an orphan."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from dagster_slurm.session.orphans import _judge

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


def _doc(heartbeat_at: float) -> dict[str, Any]:
    return {"run_id": "r-1", "job_name": "dsr-r-1-abcd", "heartbeat": {"at": heartbeat_at}}


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
