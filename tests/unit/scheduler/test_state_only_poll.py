"""Running-phase state polls use ``squeue --only-job-state`` where the release has it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dagster_slurm.agent.results import JobStatusResult
from dagster_slurm.scheduler.client import SlurmScheduler, StatusSnapshot
from dagster_slurm.scheduler.watcher import JobWatcher, with_earlier_fields
from dagster_slurm.slurm.commands import sacct_base_argv, squeue_argv, squeue_user_argv
from dagster_slurm.slurm.parsers import parse_squeue
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.version import SlurmVersion

GOLDEN = Path(__file__).resolve().parents[1] / "slurm" / "golden"
V22_05, V24_11 = SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 5)


class _Agent:
    def __init__(self, version: SlurmVersion | None) -> None:
        self.slurm_version = version


def _scheduler(version: SlurmVersion | None) -> SlurmScheduler:
    return SlurmScheduler(_Agent(version), status_path="/b/status/squeue-{uid}.json")  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [None, V22_05, SlurmVersion(26, 5, 0)])
def test_without_only_job_state_a_state_poll_is_the_usual_one(version: SlurmVersion | None) -> None:
    scheduler = _scheduler(version)
    plain = scheduler.status_op(["a"], ["11"], shared=True, accounting=False).params
    state = scheduler.status_op(["a"], ["11"], shared=True, accounting=False,
                                state_only=True).params
    assert state == {**plain, "shared": {**plain["shared"], "client": state["shared"]["client"]}}
    assert state["squeue_argv"] == squeue_argv(["a"])
    assert state["shared"]["argv"] == squeue_user_argv()


def test_on_24_11_a_state_poll_asks_only_for_the_known_ids_states() -> None:
    scheduler = _scheduler(V24_11)
    params = scheduler.status_op(["a"], ["11", "12"], shared=True, state_only=True).params
    assert params["squeue_argv"] == ["squeue", "--only-job-state", "--format=%i|%T",
                                     "--states=all", "--jobs=11,12"]
    assert "shared" not in params, "the lighter query is per poll, not the user's shared one"
    assert params["sacct_argv"] == sacct_base_argv(version=V24_11)
    assert params["sacct_argv"][-1].endswith(",Planned")
    # without known ids, or when the caller needs more than states: the usual poll
    assert scheduler.status_op(["a"], [], state_only=True).params["squeue_argv"] == \
        squeue_argv(["a"])
    assert "shared" in scheduler.status_op(["a"], ["11"], shared=True).params


def test_a_state_only_answer_makes_a_snapshot_of_states() -> None:
    text = (GOLDEN / "24.11" / "roles" / "squeue_state.txt").read_text()
    running = next(r.job_id for r in parse_squeue(text) if r.state is JobState.RUNNING)
    raw = {"squeue": {"rc": 0, "stdout": text, "stderr": ""}, "absent_ids": ["999999"],
           "sacct": None}
    snapshot = _scheduler(V24_11).snapshot(JobStatusResult.from_raw(raw), 5.0)
    observed = snapshot.job(running)
    assert observed.state is JobState.RUNNING and observed.source == "squeue"
    assert observed.reason is None and observed.start_time is None
    assert snapshot.certain and snapshot.ended_state("999999") == "UNKNOWN"


class _Scheduler:
    """Answers each poll with the states given, records whether it asked for states only."""

    def __init__(self) -> None:
        self.state = JobState.PENDING
        self.asked: list[bool] = []

    def status(self, names: Any, known: Any, **kwargs: Any) -> StatusSnapshot:
        self.asked.append(kwargs["state_only"])
        records = parse_squeue(f"JOBID|STATE\n1|{self.state.value}\n")
        return StatusSnapshot(0.0, True, {"1": records[0]}, {}, {}, ())

    def min_job_age(self) -> None:
        return None


def test_the_watcher_asks_for_states_only_while_every_tracked_job_runs() -> None:
    scheduler = _Scheduler()
    watcher = JobWatcher(scheduler, clock=lambda: 0.0, sleep=lambda s: None)  # type: ignore[arg-type]
    watcher.track("1", "a")
    watcher.poll(force=True)                       # nothing seen yet: the full poll
    watcher.poll(force=True)                       # pending: the full poll (reason, start)
    scheduler.state = JobState.RUNNING
    watcher.poll(force=True)
    watcher.poll(force=True)                       # seen running: states only
    watcher.track("2", "a")
    watcher.poll(force=True)                       # job 2 not seen running yet: full poll
    watcher.untrack("2")
    scheduler.state = JobState.REQUEUED
    watcher.poll(force=True)                       # the last answer said running
    watcher.poll(force=True)                       # queued again: the full poll
    assert scheduler.asked == [False, False, False, True, False, True, False]


def test_a_state_only_answer_keeps_the_other_fields_of_the_last_full_listing() -> None:
    full = parse_squeue("JOBID|NAME|STATE|NODELIST|PARTITION\n1|a|RUNNING|c[1-2]|cpu\n")[0]
    state = parse_squeue("JOBID|STATE\n1|COMPLETED\n2|RUNNING\n")
    earlier = StatusSnapshot(0.0, True, {"1": full}, {}, {}, ())
    now = StatusSnapshot(1.0, True, {r.job_id: r for r in state}, {}, {}, ())
    merged = with_earlier_fields(now, earlier)
    assert merged.queue["1"].state is JobState.COMPLETED
    assert merged.queue["1"].raw_state == "COMPLETED"
    assert merged.queue["1"].nodes == ("c1", "c2") and merged.queue["1"].partition == "cpu"
    assert merged.queue["2"] == now.queue["2"] and merged.observed_at == 1.0
