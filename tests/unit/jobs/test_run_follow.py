"""A waiting step follows its own Dagster run: pure parts with a fake instance and clock."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from dagster_slurm.backoff import sleep_checking
from dagster_slurm.jobs.follow import ENDED_RUN_STATUSES, DagsterRunEnded, RunFollower, follower_for
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.scheduler.watcher import JobWatcher
from dagster_slurm.slurm import JobState, SqueueRecord


class _Instance:
    """Answers get_run_by_id with ``status`` (None: unknown run; an exception: raised)."""

    def __init__(self, status: Any = "STARTED") -> None:
        self.status = status
        self.reads = 0

    def get_run_by_id(self, run_id: str) -> Any:
        self.reads += 1
        if isinstance(self.status, Exception):
            raise self.status
        if self.status is None:
            return None
        return SimpleNamespace(run_id=run_id, status=SimpleNamespace(value=self.status))


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.mark.parametrize("status", sorted(ENDED_RUN_STATUSES))
def test_a_run_that_is_no_longer_running_stops_the_wait(status: str) -> None:
    follower = RunFollower(_Instance(status), "r1")
    with pytest.raises(DagsterRunEnded, match=f"run r1 is {status}") as raised:
        follower.check("Slurm job 7")
    assert raised.value.status == status and "Slurm job 7" in str(raised.value)
    assert "no materialization is reported" in str(raised.value)


@pytest.mark.parametrize("status", ["STARTED", "STARTING", "QUEUED", "NOT_STARTED"])
def test_a_running_run_keeps_the_step_waiting(status: str) -> None:
    RunFollower(_Instance(status), "r1").check()


def test_the_instance_is_read_at_most_every_interval() -> None:
    instance, clock = _Instance(), _Clock()
    follower = RunFollower(instance, "r1", interval=3.0, clock=clock)
    for _ in range(30):
        follower.check()
        clock.sleep(0.5)
    assert instance.reads == 5  # t = 0, 3, 6, 9, 12 of 15 s
    instance.status = "FAILURE"
    clock.sleep(3.0)
    with pytest.raises(DagsterRunEnded):
        follower.check()


def test_an_unreadable_instance_or_unknown_run_never_stops_the_wait(caplog: Any) -> None:
    clock = _Clock()
    instance = _Instance(RuntimeError("database is locked"))
    follower = RunFollower(instance, "r1", interval=1.0, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="dagster_slurm.jobs"):
        for _ in range(3):
            follower.check()
            clock.sleep(1.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "database is locked" in warnings[0].getMessage()
    assert "keeps waiting" in warnings[0].getMessage()
    instance.status = None  # a run this instance does not know
    follower.check()


def test_a_context_without_instance_or_run_follows_nothing() -> None:
    follower = follower_for(SimpleNamespace())
    assert not follower.active
    follower.check()
    assert follower.checks == 0
    run = SimpleNamespace(run_id="r9")
    assert follower_for(SimpleNamespace(instance=_Instance(), run=run)).run_id == "r9"


def test_sleep_checking_slices_a_long_sleep_and_stops_when_check_raises() -> None:
    clock, seen = _Clock(), []

    def check() -> None:
        seen.append(clock.t)
        if clock.t >= 4:
            raise DagsterRunEnded("r1", "FAILURE")

    sleep_checking(clock.sleep, 2.5, check, 1.0)
    assert seen == [1.0, 2.0, 2.5]
    with pytest.raises(DagsterRunEnded):
        sleep_checking(clock.sleep, 10.0, check, 1.0)
    assert clock.t == 4.5
    sleep_checking(clock.sleep, 2.0, None, 1.0)
    assert clock.t == 6.5


class _RunningForever:
    """A job that stays RUNNING, with a 10 s back-off between polls."""

    def status(self, *args: Any, **kwargs: Any) -> StatusSnapshot:
        record = SqueueRecord(**{**{f: None for f in SqueueRecord.__dataclass_fields__},
                                 "job_id": "7", "state": JobState.RUNNING, "name": "j"})
        return StatusSnapshot(0.0, True, {"7": record}, {}, {}, ())

    def min_job_age(self) -> None:
        return None


def test_the_watcher_notices_an_ended_run_between_slow_polls() -> None:
    from dagster_slurm.backoff import PollBackoff

    clock, instance = _Clock(), _Instance()
    follower = RunFollower(instance, "r1", interval=1.0, clock=clock)
    watcher = JobWatcher(_RunningForever(), backoff=PollBackoff(initial=10.0, maximum=10.0),  # type: ignore[arg-type]
                         clock=clock, sleep=clock.sleep)
    watcher.track("7", "j")
    clock_at_fail = 25.0

    def check() -> None:
        if clock.t >= clock_at_fail:
            instance.status = "FAILURE"
        follower.check()

    with pytest.raises(DagsterRunEnded):
        watcher.wait("7", check=check, check_interval=1.0)
    assert clock.t <= clock_at_fail + 1.0  # within one check interval, not at the next poll
