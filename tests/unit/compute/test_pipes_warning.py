"""Dagster's "did not receive any messages" warning: absent for a shell payload (which never
opens Pipes), still there for a Python payload that should have opened Pipes and did not; and
no Dagster preview warning from the library's message reader. Local mode, no cluster."""

import logging
import textwrap
import warnings
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm import ComputeResource
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
