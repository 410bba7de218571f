"""Dagster's "did not receive any messages" warning: absent for a shell payload (which never
opens Pipes) and for a payload that never started (unschedulable job, refused submission),
still there for a Python payload that should have opened Pipes and did not; and no Dagster
preview warning from the library's message reader. Local mode, no cluster."""

import logging
import textwrap
import warnings
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm import ComputeResource
from dagster_slurm.jobs.errors import JobOutcome, SlurmJobUnschedulable, SlurmSubmissionError
from dagster_slurm.jobs.runner import JobRequest, PipesJobRunner, PreparedJob
from dagster_slurm.launchers import BashLauncher, is_shell_script
from dagster_slurm.pipes.quiet import NO_MESSAGES_WARNING, pipes_warning_scope


def _run(tmp_path: Path, name: str, body: str) -> tuple[bool, list[str], list[str]]:
    """Materialize one asset running payload ``name``; (success, the run's log messages,
    the Python warnings raised meanwhile)."""
    payload = tmp_path / name
    payload.write_text(textwrap.dedent(body))

    @dg.asset
    def thing(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=str(payload)).get_results()

    instance = dg.DagsterInstance.ephemeral()
    resource = ComputeResource(mode="local", local_base_path=str(tmp_path / "base"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = dg.materialize([thing], resources={"compute": resource}, instance=instance)
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    return result.success, logs, [str(w.message) for w in caught]


def test_shell_payload_runs_without_the_no_messages_warning(tmp_path):
    ok, logs, _ = _run(tmp_path, "report.sh", "echo hello from bash\n")
    assert ok
    assert not [m for m in logs if NO_MESSAGES_WARNING in m]


def test_python_payload_without_pipes_still_gets_the_warning(tmp_path):
    ok, logs, _ = _run(tmp_path, "forgot.py", "print('never opens pipes')\n")
    assert ok
    assert [m for m in logs if NO_MESSAGES_WARNING in m]


def test_the_reader_raises_no_preview_warning(tmp_path):
    _, _, caught = _run(tmp_path, "talks.py", """
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            pipes.report_asset_materialization(metadata={"n": 1})
    """)
    assert not [w for w in caught if "expected_writer_count" in w]


def test_which_payloads_count_as_shell_scripts(tmp_path):
    script = tmp_path / "x.sh"
    script.write_text("true\n")
    python = tmp_path / "x.py"
    python.write_text("pass\n")
    assert is_shell_script(str(script))
    assert not is_shell_script(str(python))
    assert not is_shell_script(f"bash {script}")  # a command: what it runs is not known
    assert not is_shell_script(str(tmp_path / "missing.sh"))
    launcher = BashLauncher()
    assert not launcher.payload_opens_pipes(str(script))
    assert launcher.payload_opens_pipes(str(python))
    assert launcher.payload_opens_pipes("python -m tool")


@pytest.mark.parametrize("opens_pipes", [True, False])
def test_the_filter_drops_only_that_warning_and_only_inside_the_block(opens_pipes):
    logger = logging.getLogger(f"test-quiet-{opens_pipes}")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.levelname} {record.getMessage()}")

    logger.addHandler(Keep())
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    with pipes_warning_scope(logger, payload="x.sh", opens_pipes=opens_pipes):
        logger.warning(NO_MESSAGES_WARNING + ". Check stdout / stderr")
        logger.warning("[pipes] did not receive closed message from external process")
        logger.info(NO_MESSAGES_WARNING)
    logger.warning(NO_MESSAGES_WARNING)
    dropped = 0 if opens_pipes else 1
    assert len(seen) == 4 - dropped
    assert seen[-1] == f"WARNING {NO_MESSAGES_WARNING}"
    assert not logger.filters


# -- a payload that never started ------------------------------------------------------------


class _NeverRuns(PipesJobRunner):
    """A runner whose payload (a Python script, expected to open Pipes) never runs: its
    start raises ``start_error``, or its wait raises ``wait_error``."""

    def __init__(self, *, start_error: BaseException | None = None,
                 wait_error: BaseException | None = None) -> None:
        self.start_error = start_error
        self.wait_error = wait_error

    def _prepare(self, context, request):
        return PreparedJob(context, request, dg.PipesTempFileContextInjector(),
                           dg.PipesTempFileMessageReader())

    def _start(self, job, pipes):
        if self.start_error is not None:
            raise self.start_error
        return "4711"

    def _wait(self, job, handle):
        raise self.wait_error

    def _terminate(self, job, handle, error):
        pass

    def _outcome(self, job, handle, result, pipes):
        raise AssertionError("not reached")


def _run_never(runner: _NeverRuns) -> tuple[list[str], str]:
    """Materialize an asset with ``runner``; the run's log messages and the step's error."""

    @dg.asset
    def never(context: dg.AssetExecutionContext):
        yield from runner.run(context, JobRequest("job.py", BashLauncher())).get_results()

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([never], instance=instance, raise_on_error=False)
    assert not result.success
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return logs, failure.step_failure_data.error.to_string()


def test_a_job_that_can_never_start_gets_no_pipes_warning():
    error = SlurmJobUnschedulable(JobOutcome("4711", "PENDING", None, reason="PartitionTimeLimit"),
                                  "pending with reason PartitionTimeLimit: lower time_limit")
    logs, message = _run_never(_NeverRuns(wait_error=error))
    assert not [m for m in logs if NO_MESSAGES_WARNING in m or "open_dagster_pipes" in m]
    assert "job can never start as submitted (job 4711, state PENDING)" in message


def test_a_refused_submission_gets_no_pipes_warning():
    logs, message = _run_never(_NeverRuns(start_error=SlurmSubmissionError(
        "sbatch rejected job 'x': Invalid partition name specified")))
    assert not [m for m in logs if NO_MESSAGES_WARNING in m]
    assert "Invalid partition name specified" in message


def test_a_payload_that_may_have_run_still_gets_the_pipes_warning():
    logs, _ = _run_never(_NeverRuns(wait_error=RuntimeError("the link broke")))
    assert [m for m in logs if NO_MESSAGES_WARNING in m]


def test_never_started_turns_the_filter_on_for_a_python_payload():
    logger = logging.getLogger("test-quiet-never-started")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger.addHandler(Keep())
    logger.propagate = False
    with pipes_warning_scope(logger, payload="x.py", opens_pipes=True) as quiet:
        logger.warning(NO_MESSAGES_WARNING)
        quiet.never_started("job 1 could never start as submitted")
        logger.warning(NO_MESSAGES_WARNING)
    assert seen == [NO_MESSAGES_WARNING] and quiet.dropped == 1
