"""Waiting for a local payload's exit: woken by the exit itself, not by a poll interval.

Real child processes; the tests synchronise on the child's exit and on the runner reaching
its wait, never on a duration.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm.compute import local_runner
from dagster_slurm.compute.local_runner import LocalRunner
from dagster_slurm.compute.process_exit import ExitWatch
from dagster_slurm.jobs.runner import JobRequest
from dagster_slurm.launchers.bash import BashLauncher

needs_pidfd = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")


def _blocked_child() -> subprocess.Popen:
    """A child that runs until its stdin is closed."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)


@needs_pidfd
def test_the_watch_wakes_when_the_child_exits_and_leaves_it_to_be_reaped() -> None:
    child = _blocked_child()
    with ExitWatch(child.pid) as watch:
        assert watch.event_driven
        assert watch.wait(0) is False  # still running
        assert child.stdin is not None
        child.stdin.close()
        assert watch.wait(60) is True  # the exit, not the timeout, ended the wait
        pid, status = os.waitpid(child.pid, os.WNOHANG)
    assert pid == child.pid and os.waitstatus_to_exitcode(status) == 0
    child.returncode = 0


def test_without_pidfd_the_watch_polls_with_a_growing_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    pauses: list[float] = []
    child = _blocked_child()
    try:
        watch = ExitWatch(child.pid, poll_initial=0.02, poll_maximum=0.05, sleep=pauses.append)
        assert not watch.event_driven
        results = [watch.wait(10), watch.wait(10), watch.wait(10), watch.wait(0.001)]
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert results == [False] * 4  # the caller checks the process itself
    assert pauses == pytest.approx([0.02, 0.03, 0.045, 0.001])


def test_closing_twice_is_harmless() -> None:
    child = _blocked_child()
    try:
        watch = ExitWatch(child.pid)
        watch.close()
        watch.close()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


PAYLOAD = textwrap.dedent("""\
    import os, time
    from dagster_pipes import open_dagster_pipes
    with open_dagster_pipes() as pipes:
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.01)
        pipes.log.info("done")
""")


@needs_pidfd
def test_the_local_runner_is_woken_by_the_exit_not_by_a_poll(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With the run's status read only every hour, the one wait of ``_wait`` ends because
    the payload exited; the final read of the Pipes files follows it."""
    go = tmp_path / "go"
    waiting = threading.Event()
    results: list[bool] = []
    original = ExitWatch.wait

    def spy(self: ExitWatch, timeout: float) -> bool:
        assert timeout == 3600.0
        waiting.set()
        result = original(self, 60.0)  # a timeout shows up as False, and the test fails
        results.append(result)
        return result

    monkeypatch.setattr(local_runner.ExitWatch, "wait", spy)
    payload = tmp_path / "payload.py"
    payload.write_text(PAYLOAD)
    runner = LocalRunner(str(tmp_path / "base"), run_status_interval=3600.0)
    request = JobRequest(str(payload), BashLauncher(), extra_env={"GO": str(go)})

    def release() -> None:
        if waiting.wait(60):
            go.touch()

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    @dg.asset
    def thing(context):
        invocation = runner.run(context, request)
        yield from invocation.get_results()

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([thing], instance=instance)
    releaser.join(60)
    assert result.success
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert "done" in logs  # the message written just before the exit was read
    assert results == [True]
