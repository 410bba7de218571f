"""The job-level pieces shared by asset scope and run scope (cancel, log lines)."""

from __future__ import annotations

import logging
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from dagster_slurm.errors import SchedulerError
from dagster_slurm.jobs.cancel import cancel_by_token, cancel_quietly
from dagster_slurm.jobs.logs import (
    NOTABLE_PREFIXES,
    ProgressLog,
    notable_lines,
    notable_stdout_sink,
)
from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.ray_script import RAY_DASHBOARD_FORMAT, RAY_TUNNEL_FORMAT
from dagster_slurm.slurm.states import JobState


class Lines:
    """A logger-like object that keeps what it was given, by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def error(self, message: str) -> None:
        self.lines.append(("error", message))


class FakeScheduler:
    def __init__(self, queue: dict[str, tuple[str, JobState]], *, status_error: bool = False,
                 cancel_error: bool = False) -> None:
        self.queue = {job_id: SimpleNamespace(comment=comment, state=state)
                      for job_id, (comment, state) in queue.items()}
        self.status_error = status_error
        self.cancel_error = cancel_error
        self.cancelled: list[str] = []

    def status(self, names: list[str]) -> SimpleNamespace:
        if self.status_error:
            raise SchedulerError("squeue: connection refused")
        return SimpleNamespace(queue=self.queue)

    def cancel(self, job_ids: list[str]) -> None:
        if self.cancel_error:
            raise SchedulerError("scancel: timed out")
        self.cancelled.extend(job_ids)


def test_cancel_by_token_cancels_only_the_active_job_carrying_the_token() -> None:
    scheduler = FakeScheduler({
        "11": ("tok-a", JobState.PENDING),
        "12": ("tok-b", JobState.RUNNING),
        "13": ("tok-a", JobState.COMPLETED),
    })
    out = Lines()
    cancel_by_token(scheduler, "dsl-run-step", "tok-a", out)  # type: ignore[arg-type]
    assert scheduler.cancelled == ["11"]
    assert out.lines == [("warning", "Cancelled Slurm job 11")]


def test_cancel_by_token_says_how_to_look_when_squeue_fails() -> None:
    scheduler = FakeScheduler({"11": ("tok-a", JobState.PENDING)}, status_error=True)
    out = Lines()
    cancel_by_token(scheduler, "dsl-run-step", "tok-a", out)  # type: ignore[arg-type]
    assert scheduler.cancelled == []
    ((level, message),) = out.lines
    assert level == "error"
    assert "comment tok-a" in message and "squeue --name=dsl-run-step" in message


def test_cancel_quietly_never_raises_and_names_the_command(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = FakeScheduler({}, cancel_error=True)
    out = Lines()
    with caplog.at_level(logging.ERROR, logger="dagster_slurm.compute"):
        cancel_quietly(scheduler, "42", out)  # type: ignore[arg-type]
    ((level, message),) = out.lines
    assert level == "error" and "`scancel 42`" in message
    assert any("`scancel 42`" in record.getMessage() for record in caplog.records)


def test_progress_log_goes_to_the_given_logger_or_to_logging(caplog: pytest.LogCaptureFixture) -> None:
    out = Lines()
    ProgressLog(out).warning("to the logger")
    assert out.lines == [("warning", "to the logger")]
    with caplog.at_level(logging.INFO, logger="dagster_slurm.session"):
        ProgressLog(None).info("to logging")
    assert [r.getMessage() for r in caplog.records] == ["to logging"]


def test_the_notable_lines_are_those_the_ray_script_prints() -> None:
    """One definition: the script's printf formats start with the prefixes the sinks match."""
    plan = ExecutionPlan(payload=("true",), job_dir="/jobs/1", status_file="/jobs/1/exit_status",
                         drain_file="/jobs/1/drain_signal", mode="slurm")
    script = RayLauncher().render(plan)
    for fmt in (RAY_DASHBOARD_FORMAT, RAY_TUNNEL_FORMAT):
        assert f"printf {shlex.quote(fmt)}" in script
    printed = subprocess.run(
        ["bash", "-c", f"printf {shlex.quote(RAY_DASHBOARD_FORMAT)} 10.0.0.5 8301; echo other; "
                       f"printf {shlex.quote(RAY_TUNNEL_FORMAT)} 10.0.0.5 8301 http://127.0.0.1:8265"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert notable_lines(printed) == [
        "Ray head node web UI: http://10.0.0.5:8301",
        "To reach it from your machine: ssh -L 8265:10.0.0.5:8301 <login-host>, then open "
        "http://127.0.0.1:8265",
    ]
    assert all(line.startswith(NOTABLE_PREFIXES) for line in notable_lines(printed))


def test_notable_stdout_sink_copies_every_line_and_logs_the_notable_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = Lines()
    sink = notable_stdout_sink(out)
    sink("step 1\n")
    sink("Ray head node web UI: http://10.0.0.5:8301\n")
    assert capsys.readouterr().out == "step 1\nRay head node web UI: http://10.0.0.5:8301\n"
    assert out.lines == [("info", "Ray head node web UI: http://10.0.0.5:8301")]
