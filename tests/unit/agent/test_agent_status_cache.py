"""The user's shared squeue answer (agent/remote/status_cache.py), with a fake squeue."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from dagster_slurm.agent.remote.status_cache import lines_of, shared_squeue

ARGV = ["squeue", "--me"]


class FakeSqueue:
    """Counts calls; answers with the listed job ids (one line each)."""

    def __init__(self, ids: list[str], rc: int = 0) -> None:
        self.ids = ids
        self.rc = rc
        self.calls = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def __call__(self, argv: list, timeout: float) -> dict:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        out = "".join(f"{i}|job|RUNNING\n" for i in self.ids)
        return {"rc": self.rc, "stdout": out if self.rc == 0 else "", "stderr": "" if self.rc == 0 else "down"}


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def spec(tmp_path: Path, max_age: float = 2.0) -> dict:
    return {"path": str(tmp_path / "status" / "squeue-{uid}.json"), "argv": ARGV, "max_age": max_age}


def test_a_fresh_answer_listing_every_known_job_is_served_without_a_squeue(tmp_path: Path) -> None:
    squeue, clock = FakeSqueue(["11", "12"]), Clock()
    first = shared_squeue(spec(tmp_path), ["11"], 30, squeue, clock)
    assert first["shared"]["ran"] and squeue.calls == 1
    clock.t += 1.5
    second = shared_squeue(spec(tmp_path), ["11", "12"], 30, squeue, clock)
    assert not second["shared"]["ran"] and squeue.calls == 1
    assert second["shared"]["age"] == 1.5 and second["stdout"] == first["stdout"]


def test_an_old_answer_or_one_missing_a_known_job_needs_a_new_squeue(tmp_path: Path) -> None:
    squeue, clock = FakeSqueue(["11"]), Clock()
    shared_squeue(spec(tmp_path), ["11"], 30, squeue, clock)
    clock.t += 2.5  # older than max_age
    assert shared_squeue(spec(tmp_path), ["11"], 30, squeue, clock)["shared"]["ran"]
    clock.t += 0.1
    squeue.ids = ["11", "13"]  # 13 was submitted after the last answer was taken
    answer = shared_squeue(spec(tmp_path), ["11", "13"], 30, squeue, clock)
    assert answer["shared"]["ran"] and squeue.calls == 3 and "13|" in answer["stdout"]


def test_max_age_zero_serves_only_an_answer_taken_after_the_request_started(tmp_path: Path) -> None:
    squeue, clock = FakeSqueue(["11"]), Clock()
    shared_squeue(spec(tmp_path), ["11"], 30, squeue, clock)
    clock.t += 0.01
    assert shared_squeue(spec(tmp_path, 0.0), ["11"], 30, squeue, clock)["shared"]["ran"]
    assert squeue.calls == 2


def test_a_failed_squeue_is_shared_for_max_age_and_never_becomes_an_absence(tmp_path: Path) -> None:
    squeue, clock = FakeSqueue([], rc=1), Clock()
    first = shared_squeue(spec(tmp_path), ["11"], 30, squeue, clock)
    clock.t += 1
    second = shared_squeue(spec(tmp_path), ["11"], 30, squeue, clock)
    assert first["rc"] == second["rc"] == 1 and squeue.calls == 1
    assert not second["shared"]["ran"]


def test_concurrent_requests_that_need_a_new_answer_share_one_squeue(tmp_path: Path) -> None:
    squeue = FakeSqueue(["11"])
    squeue.gate = threading.Event()
    answers: list[dict] = []
    # the first request runs squeue and holds the refresh lock while it does
    first = threading.Thread(target=lambda: answers.append(
        shared_squeue(spec(tmp_path, 0.0), ["11"], 30, squeue)))
    first.start()
    assert squeue.entered.wait(10)
    # five more start while it runs: its answer was taken before they started, so it cannot
    # serve them; they queue on the lock, the first of them runs one more squeue, and the
    # others are served that answer (taken after they all started) instead of one each
    later = [threading.Thread(target=lambda: answers.append(
        shared_squeue(spec(tmp_path, 0.0), ["11"], 30, squeue))) for _ in range(5)]
    for thread in later:
        thread.start()
    squeue.gate.set()
    for thread in [first, *later]:
        thread.join(20)
    assert len(answers) == 6 and all(a["rc"] == 0 for a in answers)
    assert squeue.calls <= 3, squeue.calls


def test_the_file_is_private_and_written_whole(tmp_path: Path) -> None:
    squeue = FakeSqueue(["11"])
    shared_squeue(spec(tmp_path), ["11"], 30, squeue)
    path = tmp_path / "status" / f"squeue-{os.getuid()}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    data = json.loads(path.read_text())
    assert data["argv"] == ARGV and data["rc"] == 0 and "11|" in data["stdout"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_an_unreadable_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "status" / f"squeue-{os.getuid()}.json"
    path.parent.mkdir(mode=0o700)
    path.write_text("{not json")
    squeue = FakeSqueue(["11"])
    assert shared_squeue(spec(tmp_path), ["11"], 30, squeue)["shared"]["ran"]
    assert json.loads(path.read_text())["rc"] == 0


def test_an_answer_for_another_squeue_is_not_served(tmp_path: Path) -> None:
    squeue, clock = FakeSqueue(["11"]), Clock()
    shared_squeue(spec(tmp_path), ["11"], 30, squeue, clock)
    other = dict(spec(tmp_path), argv=["squeue", "--me", "--other-format"])
    assert shared_squeue(other, ["11"], 30, squeue, clock)["shared"]["ran"]


def test_a_request_gets_only_its_own_jobs_lines() -> None:
    out = "11|a\n12|b\n130|c\n14_3|d\n15+0|e\n"
    assert lines_of(out, ["11", "14", "15"]) == "11|a\n14_3|d\n15+0|e\n"


def test_with_several_pollers_a_newer_answer_waits_for_the_floor_after_anothers_refresh(
        tmp_path: Path) -> None:
    squeue, clock = FakeSqueue(["11"]), Clock()
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        clock.t += seconds

    floored = dict(spec(tmp_path, 0.0), floor=2.0)
    shared_squeue(dict(floored, client="a"), ["11"], 30, squeue, clock, sleep=nap)
    clock.t += 0.5
    # the same client asks again at once: its own refresh sets no floor
    shared_squeue(dict(floored, client="a"), ["11"], 30, squeue, clock, sleep=nap)
    assert naps == [] and squeue.calls == 2
    clock.t += 0.5
    # another client needs a newer answer: it waits until 2 s after a's refresh
    answer = shared_squeue(dict(floored, client="b"), ["11"], 30, squeue, clock, sleep=nap)
    assert naps == [1.5] and squeue.calls == 3 and answer["shared"]["ran"]
