"""ComputeResource in local mode, end to end through dagster.materialize (no cluster needed)."""

import textwrap
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm import ComputeResource, SlurmJobNonZeroExit
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.signals import drain_signal_of


def _materialize(tmp_path: Path, body: str, **run_kwargs):
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent(body))
    base = tmp_path / "base"

    @dg.asset
    def thing(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=str(payload), **run_kwargs).get_results()

    resource = ComputeResource(mode="local", local_base_path=str(base))
    return dg.materialize([thing], resources={"compute": resource}, raise_on_error=False), base


OK = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"rows": 3})
"""


def test_local_run_reports_metadata_and_cleans_up(tmp_path):
    result, base = _materialize(tmp_path, OK)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["rows"].value == 3
    assert event.materialization.metadata["dagster_slurm/mode"].value == "local"
    assert not any((base / "runs").iterdir()), "a successful run leaves no files behind"


def test_failed_local_run_keeps_its_files_and_names_the_state(tmp_path):
    result, base = _materialize(tmp_path, "import sys; print('boom', file=sys.stderr); sys.exit(4)\n")
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    text = failures[0].step_failure_data.error.cause.message
    assert "state FAILED" in text and "exit code 4" in text and "boom" in text
    (job_dir,) = [p for p in (base / "runs").rglob("stderr.log")]
    assert "boom" in job_dir.read_text()


@pytest.mark.parametrize("opts", [{"mem": "lots"}, {"cpus_per_task": -3}, {"time_limit": "-5"}])
def test_local_mode_checks_slurm_option_values_too(tmp_path, opts):
    result, _ = _materialize(tmp_path, OK, extra_slurm_opts=opts)
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "ConfigurationError" in failures[0].step_failure_data.error.cause.cls_name


def test_drain_signal_from_signal_before_timeout():
    assert drain_signal_of(None) is None
    assert drain_signal_of("USR1@60") == "USR1"
    assert drain_signal_of("B:TERM@120") == "TERM"


def test_error_types_are_exported():
    assert issubclass(SlurmJobNonZeroExit, Exception)
    assert issubclass(ConfigurationError, ValueError)


def test_local_payload_runs_in_this_python_environment(tmp_path):
    import sys

    result, _ = _materialize(tmp_path, """
        import os, sys
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            pipes.report_asset_materialization(metadata={
                "path0": os.environ["PATH"].split(os.pathsep)[0], "python": sys.executable})
    """)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["path0"].value == str(Path(sys.executable).parent)


def test_a_local_step_whose_run_failed_elsewhere_stops_its_process(tmp_path):
    """The run worker died and Dagster marked the run FAILURE: the step process ends its
    payload and fails without the materialization the payload had reported."""
    import os
    import threading
    import time

    mark = tmp_path / "pid"
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent(f"""
        import os, time
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            pipes.report_asset_materialization(metadata={{"early": 1}})
            open({str(mark)!r} + ".tmp", "w").write(str(os.getpid()))
            os.replace({str(mark)!r} + ".tmp", {str(mark)!r})
            time.sleep(300)
    """))

    @dg.asset
    def thing(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=str(payload)).get_results()

    instance = dg.DagsterInstance.ephemeral()
    resource = ComputeResource(mode="local", local_base_path=str(tmp_path / "base"),
                               run_status_interval=0.5)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", dg.materialize(
        [thing], resources={"compute": resource}, instance=instance, raise_on_error=False)),
        daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(mark.read_text())
    (run,) = instance.get_runs()
    instance.report_run_failed(run, "the run worker died (simulated)")
    thread.join(60)
    assert not thread.is_alive(), "the step kept waiting on its payload"
    result = outcome["result"]
    assert not result.get_asset_materialization_events()
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure and "DagsterRunEnded" in failure[0].step_failure_data.error.to_string()
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "the payload outlived its step"
