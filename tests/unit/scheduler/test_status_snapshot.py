"""How one poll's squeue, accounting and status files combine: the scheduler's state wins."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.scheduler.watcher import JobLost, JobWatcher
from dagster_slurm.slurm import JobState, SacctRecord, SqueueRecord


def _record(cls: type, job_id: str, state: JobState, **values: Any) -> Any:
    empty = {f.name: None for f in dataclasses.fields(cls)}
    return cls(**{**empty, "job_id": job_id, "state": state, **values})


def _snapshot(*, queue: JobState | None = None, acct: JobState | None = None,
              status_file: int | None = None, certain: bool = True) -> StatusSnapshot:
    listed = {"7": _record(SqueueRecord, "7", queue, name="j")} if queue else {}
    accounting = {"7": _record(SacctRecord, "7", acct)} if acct else {}
    codes = {"7": status_file} if status_file is not None else {}
    absent = () if listed or not certain else ("7",)
    return StatusSnapshot(0.0, certain, listed, accounting, codes, absent)


@pytest.mark.parametrize("state", [JobState.CANCELLED, JobState.TIMEOUT, JobState.PREEMPTED])
def test_accounting_state_wins_over_a_status_file_saying_zero(state: JobState) -> None:
    observed = _snapshot(acct=state, status_file=0).job("7")
    assert observed.state is state and observed.source == "sacct" and observed.exit_code == 0


def test_final_squeue_state_wins_over_a_status_file_saying_zero() -> None:
    observed = _snapshot(queue=JobState.CANCELLED, status_file=0).job("7")
    assert observed.state is JobState.CANCELLED and observed.source == "squeue"


@pytest.mark.parametrize("code", [0, 3])
def test_status_file_alone_gives_no_state(code: int) -> None:
    snapshot = _snapshot(status_file=code)
    observed = snapshot.job("7")
    assert observed.state is None and not observed.terminal and observed.exit_code == code
    assert snapshot.ended_state("7") == "UNKNOWN"


class _SilentScheduler:
    """Always the same poll: the job left squeue, accounting silent, status file 0."""

    def status(self, *args: Any, **kwargs: Any) -> StatusSnapshot:
        return _snapshot(status_file=0)

    def min_job_age(self) -> None:
        return None


def test_watcher_reports_a_status_file_without_scheduler_state_as_lost_not_completed() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    watcher = JobWatcher(_SilentScheduler(), clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]
    watcher.track("7", "j", status_file="/x/status")
    with pytest.raises(JobLost, match="exit code 0, which is not taken as its outcome"):
        watcher.wait("7", timeout=60)
