"""Every poll of the shared watcher carries new heartbeat content for its tracked jobs."""

from __future__ import annotations

from typing import Any

from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.scheduler.watcher import JobWatcher, heartbeat_content


class _RecordingScheduler:
    """Answers every poll with 'still running' and records what each poll asked for."""

    def __init__(self) -> None:
        self.polls: list[dict[str, Any]] = []

    def status(self, names: Any, known: Any, **kwargs: Any) -> StatusSnapshot:
        self.polls.append({"names": list(names), **kwargs})
        return StatusSnapshot(0.0, False, {}, {}, {}, ())

    def min_job_age(self) -> None:
        return None


def _watcher(scheduler: _RecordingScheduler) -> JobWatcher:
    now = [0.0]
    return JobWatcher(scheduler, clock=lambda: now[0], sleep=lambda s: None)  # type: ignore[arg-type]


def test_each_poll_writes_new_content_to_every_tracked_heartbeat_in_the_same_call() -> None:
    scheduler = _RecordingScheduler()
    watcher = _watcher(scheduler)
    watcher.track("1", "dsl-a-x", status_file="/j1/exit_status", heartbeat_file="/j1/heartbeat")
    watcher.track("2", "dsl-a-y", heartbeat_file="/j2/heartbeat")
    watcher.track("3", "dsl-a-z")  # no heartbeat file: nothing written for it
    for _ in range(3):
        watcher.poll(force=True)
    assert len(scheduler.polls) == 3, "one scheduler call per poll, heartbeats included"
    beats = [poll["heartbeats"] for poll in scheduler.polls]
    assert all(set(b) == {"/j1/heartbeat", "/j2/heartbeat"} for b in beats)
    contents = [b["/j1/heartbeat"] for b in beats]
    assert len(set(contents)) == 3, "the content changes with every poll"
    watcher.untrack("1")
    watcher.poll(force=True)
    assert set(scheduler.polls[-1]["heartbeats"]) == {"/j2/heartbeat"}


def test_a_reused_poll_writes_nothing() -> None:
    scheduler = _RecordingScheduler()
    watcher = _watcher(scheduler)
    watcher.track("1", "dsl-a-x", heartbeat_file="/j1/heartbeat")
    watcher.poll()
    watcher.poll()  # younger than the interval (the clock does not move): reused
    assert len(scheduler.polls) == 1


def test_heartbeat_content_starts_with_the_clock_and_differs_by_sequence() -> None:
    first = heartbeat_content(1, clock=lambda: 1234.5)
    assert first.split()[0] == "1234.500" and first.endswith(" 1\n")
    assert heartbeat_content(2, clock=lambda: 1234.5) != first


def test_a_poll_with_heartbeats_is_still_one_round_trip(tmp_path: Any) -> None:
    """Through the real agent (run locally): the status op and the heartbeat writes go in one
    request; files get 0600; a job directory already removed is not created again."""
    import stat
    import sys

    from dagster_slurm.agent.client import AgentClient
    from dagster_slurm.scheduler.client import SlurmScheduler
    from dagster_slurm.transport.local import LocalTransport

    agent = AgentClient(LocalTransport(default_timeout=60), str(tmp_path / "base"),
                        python=sys.executable)
    scheduler = SlurmScheduler(agent)
    scheduler.status(["warm-up"])  # installs the agent program
    (tmp_path / "job").mkdir()
    live, removed = tmp_path / "job" / "heartbeat", tmp_path / "gone" / "heartbeat"
    before = agent.transport.stats.round_trips
    for seq in (1, 2):
        scheduler.status(["dsl-x"], ["1", "2"], heartbeats={
            str(live): heartbeat_content(seq), str(removed): heartbeat_content(seq)})
    assert agent.transport.stats.round_trips - before == 2, "one round trip per poll"
    assert live.read_text().endswith(" 2\n")
    assert stat.S_IMODE(live.stat().st_mode) == 0o600
    assert not removed.parent.exists()
