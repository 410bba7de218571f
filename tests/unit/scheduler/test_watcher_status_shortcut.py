"""The exit-status shortcut of the watcher: a job whose status file appeared is polled at
once with a fresh shared answer, and only the scheduler's state ends the wait."""

from __future__ import annotations

import threading
from typing import Any

from dagster_slurm.backoff import PollBackoff
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.scheduler.watcher import JobWatcher
from dagster_slurm.slurm import SqueueRecord
from dagster_slurm.slurm.states import JobState


def _record(job_id: str, state: JobState) -> SqueueRecord:
    fields = {f: None for f in SqueueRecord.__dataclass_fields__}
    return SqueueRecord(**{**fields, "job_id": job_id, "name": "j", "state": state,
                           "raw_state": state.value})


class _Scheduler:
    """Says RUNNING for the first ``running`` polls, then COMPLETED; records each poll."""

    def __init__(self, running: int) -> None:
        self.running = running
        self.polls: list[dict[str, Any]] = []
        self.polled = threading.Condition()

    def status(self, names: Any, known: Any, **kwargs: Any) -> StatusSnapshot:
        with self.polled:
            self.polls.append(kwargs)
            self.polled.notify_all()
        state = JobState.RUNNING if len(self.polls) <= self.running else JobState.COMPLETED
        return StatusSnapshot(0.0, True, {"7": _record("7", state)}, {}, {}, ())

    def min_job_age(self) -> None:
        return None

    def wait_polls(self, n: int) -> None:
        with self.polled:
            assert self.polled.wait_for(lambda: len(self.polls) >= n, 10), self.polls


def _wait_in_thread(watcher: JobWatcher, **kwargs: Any) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        out["observation"] = watcher.wait("7", **kwargs)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_payload_ended_cuts_the_first_poll_short_and_asks_for_a_fresh_answer() -> None:
    scheduler = _Scheduler(running=0)
    watcher = JobWatcher(scheduler, backoff=PollBackoff(initial=60.0, maximum=60.0))  # type: ignore[arg-type]
    watcher.track("7", "j", status_file="/j/status")
    thread, out = _wait_in_thread(watcher, first_poll=60.0)
    watcher.payload_ended("7")
    thread.join(10)
    assert not thread.is_alive(), "the wait did not end after payload_ended"
    assert out["observation"].state is JobState.COMPLETED
    assert scheduler.polls == [dict(scheduler.polls[0], shared=True, fresh=True)]


def test_a_status_file_does_not_end_the_wait_while_the_scheduler_runs_the_job() -> None:
    # the batch script still runs its own epilogue after writing the status file
    scheduler = _Scheduler(running=2)
    watcher = JobWatcher(scheduler, backoff=PollBackoff(initial=0.01, maximum=0.01))  # type: ignore[arg-type]
    watcher.track("7", "j", status_file="/j/status")
    thread, out = _wait_in_thread(watcher, first_poll=60.0)
    watcher.payload_ended("7")
    scheduler.wait_polls(1)
    thread.join(10)
    assert out["observation"].state is JobState.COMPLETED
    assert len(scheduler.polls) == 3, "ended only once the scheduler said so"
    assert all(p["fresh"] and p["shared"] for p in scheduler.polls)


def test_without_a_status_file_polls_are_shared_and_may_be_served_an_older_answer() -> None:
    scheduler = _Scheduler(running=1)
    watcher = JobWatcher(scheduler, backoff=PollBackoff(initial=0.01, maximum=0.01))  # type: ignore[arg-type]
    watcher.track("7", "j")
    thread, out = _wait_in_thread(watcher)
    thread.join(10)
    assert out["observation"].state is JobState.COMPLETED
    assert [(p["shared"], p["fresh"]) for p in scheduler.polls] == [(True, False)] * 2


def test_payload_ended_for_an_untracked_job_is_ignored() -> None:
    scheduler = _Scheduler(running=0)
    watcher = JobWatcher(scheduler)  # type: ignore[arg-type]
    watcher.payload_ended("8")
    watcher.track("8", "j")
    watcher.poll()
    assert scheduler.polls[0]["fresh"] is False
