"""The runner template (jobs/runner.py): the order of the steps, and that ``_terminate`` is
called exactly once when waiting fails or is interrupted, and never otherwise.

A fake runner stands in for the three real ones (their behaviour on the cluster is covered
by tests/integration/test_compute_slurm.py and test_sessions.py); it runs inside a real
Dagster asset, with the library's real Pipes injector and reader over local files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_slurm.jobs.runner import JobRequest, PipesJobRunner, PreparedJob
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.reader import PipesTailMessageReader
from dagster_slurm.pipes.sources import LocalFileSource


@dataclass
class FakeRunner(PipesJobRunner[PreparedJob, str, dict]):
    """Records every step it is asked to do; ``_wait`` returns ``result`` or raises ``error``."""

    directory: Path
    error: BaseException | None = None
    result: dict = field(default_factory=lambda: {"exit_code": 0})
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def _prepare(self, context: Any, request: JobRequest) -> PreparedJob:
        d = self.directory
        self.calls.append(("prepare", request.payload_path))
        reader = PipesTailMessageReader(LocalFileSource(), str(d / "messages"), str(d / "stdout"),
                                        str(d / "stderr"), poll_interval=0.05)
        return PreparedJob(context, request, PipesDeferredFileContextInjector(str(d / "ctx")), reader)

    def _start(self, job: PreparedJob, pipes: Any) -> str:
        self.calls.append(("start", "DAGSTER_PIPES_CONTEXT" in pipes.get_bootstrap_env_vars()))
        return "handle-1"

    def _wait(self, job: PreparedJob, handle: str) -> dict:
        self.calls.append(("wait", handle))
        if self.error is not None:
            raise self.error
        return self.result

    def _terminate(self, job: PreparedJob, handle: str, error: BaseException) -> None:
        self.calls.append(("terminate", (handle, type(error).__name__)))

    def _outcome(self, job: PreparedJob, handle: str, result: dict,
                 pipes: Any) -> dg.PipesClientCompletedInvocation:
        self.calls.append(("outcome", (handle, result)))
        return dg.PipesClientCompletedInvocation(pipes, metadata={"exit_code": result["exit_code"]})


def _materialize(runner: FakeRunner, expect: type[BaseException] | None = None) -> dg.ExecuteInProcessResult:
    @dg.asset
    def thing(context):
        request = JobRequest("payload.py", BashLauncher(), extras={"k": 1})
        if expect is None:
            yield from runner.run(context, request).get_results()
            return
        with pytest.raises(expect):
            runner.run(context, request)
        yield dg.MaterializeResult()

    result = dg.materialize([thing])
    assert result.success
    return result


def test_success_calls_each_step_once_and_never_terminate(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path, result={"exit_code": 0, "marker": "from _wait"})
    result = _materialize(runner)
    assert [name for name, _ in runner.calls] == ["prepare", "start", "wait", "outcome"]
    assert runner.calls[1] == ("start", True)  # _start sees the open Pipes session
    # _outcome gets the handle _start returned and exactly what _wait returned
    assert runner.calls[3] == ("outcome", ("handle-1", {"exit_code": 0, "marker": "from _wait"}))
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["exit_code"].value == 0


@pytest.mark.parametrize("error", [RuntimeError("link dropped"), KeyboardInterrupt()])
def test_an_error_while_waiting_terminates_once_and_propagates(tmp_path: Path,
                                                               error: BaseException) -> None:
    runner = FakeRunner(tmp_path, error=error)
    _materialize(runner, expect=type(error))
    assert [name for name, _ in runner.calls] == ["prepare", "start", "wait", "terminate"]
    assert runner.calls[3] == ("terminate", ("handle-1", type(error).__name__))


def test_an_error_in_start_or_outcome_does_not_terminate(tmp_path: Path) -> None:
    class FailingStart(FakeRunner):
        def _start(self, job: PreparedJob, pipes: Any) -> str:
            raise RuntimeError("submission refused")

    class FailingOutcome(FakeRunner):
        def _outcome(self, job: PreparedJob, handle: str, result: dict, pipes: Any) -> Any:
            raise RuntimeError("payload failed")

    starting = FailingStart(tmp_path)
    _materialize(starting, expect=RuntimeError)
    assert [name for name, _ in starting.calls] == ["prepare"]
    ending = FailingOutcome(tmp_path)
    _materialize(ending, expect=RuntimeError)
    assert [name for name, _ in ending.calls] == ["prepare", "start", "wait"]
