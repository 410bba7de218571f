"""The local runner on the runner template: an interrupt while waiting ends the payload;
a payload that died without closing Pipes is not waited for.

Real processes: the job script and the payload run as in local mode; only the moment of the
interrupt is chosen by the test (once the payload has said it is running).
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm.compute.local_runner import LocalExit, LocalJob, LocalProcess, LocalRunner
from dagster_slurm.jobs.errors import SlurmJobNonZeroExit
from dagster_slurm.jobs.runner import JobRequest
from dagster_slurm.launchers.bash import BashLauncher

PAYLOAD = textwrap.dedent("""\
    import os, signal, sys, time
    marks = os.environ["MARKS"]

    def on_term(*_):
        open(os.path.join(marks, "terminated"), "w").close()
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(marks, "pid"), "w") as handle:
        handle.write(str(os.getpid()))
    open(os.path.join(marks, "ready"), "w").close()
    time.sleep(120)
""")


class InterruptedWhenReady(LocalRunner):
    """Raises KeyboardInterrupt from ``_wait`` once the payload has written its ready file."""

    marks: Path

    def _wait(self, job: LocalJob, handle: LocalProcess) -> LocalExit:
        deadline = time.monotonic() + 30
        while not (self.marks / "ready").exists():
            assert handle.proc.poll() is None, Path(job.paths.stderr).read_text()
            assert time.monotonic() < deadline, "the payload never started"
            time.sleep(0.02)
        raise KeyboardInterrupt


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_interrupt_while_waiting_terminates_the_payload(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    payload = tmp_path / "payload.py"
    payload.write_text(PAYLOAD)
    runner = InterruptedWhenReady(str(tmp_path / "base"), kill_grace=20)
    runner.marks = marks
    request = JobRequest(str(payload), BashLauncher(), extra_env={"MARKS": str(marks)})

    @dg.asset
    def thing(context):
        with pytest.raises(KeyboardInterrupt):
            runner.run(context, request)
        yield dg.MaterializeResult()

    assert dg.materialize([thing]).success
    assert (marks / "terminated").exists(), "the payload did not get SIGTERM"
    pid = int((marks / "pid").read_text())
    assert not _alive(pid)


DIES_WITHOUT_CLOSING = textwrap.dedent("""\
    import os
    from dagster_pipes import open_dagster_pipes
    pipes = open_dagster_pipes()
    pipes.log.info("last words")
    os._exit(3)  # no closed message
""")


class KeepsTheJob(LocalRunner):
    """Keeps the prepared job, so the test can read its reader's counters."""

    job: LocalJob | None = None

    def _prepare(self, context, request: JobRequest) -> LocalJob:
        self.job = super()._prepare(context, request)
        return self.job


def test_a_payload_that_died_without_closing_pipes_is_not_waited_for(tmp_path: Path) -> None:
    """Local files are complete once the process has exited: the final drain ends as soon as
    it has read them to their end, without polling on for a closed message."""
    payload = tmp_path / "payload.py"
    payload.write_text(DIES_WITHOUT_CLOSING)
    runner = KeepsTheJob(str(tmp_path / "base"))
    request = JobRequest(str(payload), BashLauncher())

    @dg.asset
    def thing(context):
        with pytest.raises(SlurmJobNonZeroExit, match="exit code 3"):
            runner.run(context, request)
        yield dg.MaterializeResult()

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([thing], instance=instance)
    assert result.success
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    assert "last words" in messages
    assert runner.job is not None
    reader = runner.job.reader
    assert reader.opened_payload is not None and not reader.received_closed
    assert reader.stats.drain_polls <= 2  # read to the end, then settled


WAITS_TO_BE_SEEN = textwrap.dedent("""\
    import os, time
    from dagster_pipes import open_dagster_pipes
    with open_dagster_pipes() as pipes:
        pipes.log.info("early")
        while not os.path.exists(os.environ["SEEN"]):
            time.sleep(0.01)
""")


class SlowToNoticeFiles(KeepsTheJob):
    """A reader that, before it has seen any file, waits an hour between reads."""

    def _prepare(self, context, request: JobRequest) -> LocalJob:
        job = super()._prepare(context, request)
        job.reader.idle_interval = 3600.0
        return job


def test_messages_are_read_while_the_payload_runs_from_its_start(tmp_path: Path) -> None:
    """The reader's first look finds no files (the script starts after the Pipes session
    opened); starting the script wakes it, so the first message arrives while the payload
    still runs, and the payload is let go only once it has."""
    seen = tmp_path / "seen"
    payload = tmp_path / "payload.py"
    payload.write_text(WAITS_TO_BE_SEEN)
    runner = SlowToNoticeFiles(str(tmp_path / "base"))
    request = JobRequest(str(payload), BashLauncher(), extra_env={"SEEN": str(seen)})
    delivered_early = threading.Event()

    def let_go_once_read() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            job = runner.job
            if job is not None and job.reader.stats.messages >= 2:  # opened, "early"
                delivered_early.set()
                break
            time.sleep(0.01)
        seen.touch()

    watcher = threading.Thread(target=let_go_once_read, daemon=True)

    @dg.asset
    def thing(context):
        watcher.start()
        yield from runner.run(context, request).get_results()

    assert dg.materialize([thing]).success
    watcher.join(60)
    assert delivered_early.is_set(), "the first message was read only after the payload ended"
