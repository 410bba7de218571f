"""A step process SIGKILLed mid-payload: the retried step attaches (dev cluster, real Dagster
multiprocess executor, real Slurm job steps).

The asset calls ``compute.run`` twice: a short preparation payload, then a payload that
reports a Pipes message per unit of work (a log line, a custom message) and a
materialization at the end. The step's process is killed while the second payload runs; an
op ``RetryPolicy`` makes Dagster retry the step in the same run, in a new process. The retry
runs the preparation again (its first call's invocation was read and consumed by the killed
attempt) and attaches to the second call's invocation: that payload started once, and each
custom message and the materialization reach Dagster once. Modes: ``running`` (the payload
goes on only once the retry has attached), ``finished`` (the retry attaches after the
payload has ended: its status file is there), ``drained`` (the retry requests a drain
before it attaches: ``SlurmStepDrained`` with every custom message; the payload gets the
drain signal once, from Slurm, not a second copy from the step's script)."""

import glob
import json
import os
import shutil
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from compute_support import logged, slurm_resource, wait_until, write_payload
from session_support import active_jobs, session_compute

from dagster_slurm import ComputeResource, SlurmStepDrained
from dagster_slurm.agent import write_file_op

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).parent
UNITS = 8

PREPARE_PAYLOAD = """
import os
from dagster_pipes import open_dagster_pipes
with open(os.path.join(os.environ["MARKS"], "prepare-starts"), "a") as handle:
    handle.write(f"{os.getpid()}\\n")
with open_dagster_pipes() as pipes:
    pipes.report_custom_message({"prepared": True})
"""

UNITS_PAYLOAD = """
import os, signal, time
from dagster_pipes import open_dagster_pipes
marks = os.environ["MARKS"]
units = int(os.environ["UNITS"])
drained = []
signal.signal(signal.SIGTERM, lambda *_: drained.append(True))  # the drain signal
with open(os.path.join(marks, "starts"), "a") as handle:
    handle.write(f"{os.getpid()}\\n")
with open_dagster_pipes() as pipes:
    for unit in range(units):
        pipes.log.info(f"unit {unit} of {units}")
        pipes.report_custom_message({"unit": unit})
        with open(os.path.join(marks, "units"), "a") as handle:
            handle.write(f"{unit}\\n")
        if unit == 2:
            # the test kills the step's process now; go on once it says so (or on a drain)
            deadline = time.monotonic() + 240
            while not (os.path.exists(os.path.join(marks, "go")) or drained) \\
                    and time.monotonic() < deadline:
                time.sleep(0.2)
        if drained:
            time.sleep(1.0)  # a second copy of the drain would come within milliseconds
            pipes.report_custom_message({"drained_after": unit, "signals": len(drained)})
            break
        time.sleep(0.1)  # a unit's work; the order with the test is by the marks above
    else:
        pipes.report_asset_materialization(metadata={"units": units,
                                                     "slurm_job_id": os.environ["SLURM_JOB_ID"]})
open(os.path.join(marks, "done"), "w").close()
"""


@dg.asset(retry_policy=dg.RetryPolicy(max_retries=1))
def relayed(context: dg.AssetExecutionContext, compute: ComputeResource):
    marks, mode = os.environ["DSLURM_TEST_MARKS"], os.environ["DSLURM_TEST_MODE"]
    attempt = context.retry_number
    Path(marks, f"pid-{attempt}").write_text(str(os.getpid()))
    env = {"MARKS": marks, "UNITS": str(UNITS)}
    prepared = compute.run(context=context, payload_path=os.environ["DSLURM_TEST_PREPARE"],
                           extra_env=env)
    if attempt > 0 and mode == "finished":
        wait_until(lambda: os.path.exists(os.path.join(marks, "done")), 120, "the payload's end")
    if attempt > 0 and mode == "drained":
        compute.get_run_allocation_session(context).allocation.request_drain()
    try:
        invocation = compute.run(context=context, payload_path=os.environ["DSLURM_TEST_PAYLOAD"],
                                 extra_env=env)
    except SlurmStepDrained as drained:
        Path(marks, f"custom-{attempt}.json").write_text(json.dumps({
            "prepare": prepared.get_custom_messages(),
            "units": drained.invocation.get_custom_messages(),
            "exit_code": drained.result.exit_code, "drain_signal": drained.result.drain_signal,
        }))
        yield dg.MaterializeResult(metadata={"drained": True})
        return
    Path(marks, f"custom-{attempt}.json").write_text(json.dumps({
        "prepare": prepared.get_custom_messages(), "units": invocation.get_custom_messages(),
    }))
    yield from invocation.get_results()


def reattach_job() -> dg.JobDefinition:
    defs = dg.Definitions(
        assets=[relayed],
        resources={"compute": session_compute()},
        jobs=[dg.define_asset_job("reattach", executor_def=dg.multiprocess_executor)],
    )
    return defs.resolve_job_def("reattach")


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _lines(path: str) -> list[str]:
    return Path(path).read_text().split() if os.path.exists(path) else []


def _killer(instance: dg.DagsterInstance, marks: str, mode: str,
            failures: list[BaseException]) -> None:
    """SIGKILL the step's first process once the payload is mid-way; then let the payload go
    on: ``running``: once the retry has attached; ``finished``: at once (the retry waits for
    the payload's end before it attaches); ``drained``: only on failure (the drain the retry
    requests ends the payload)."""
    try:
        wait_until(lambda: len(_lines(f"{marks}/units")) >= 3, 240, "the payload's third unit")
        pid = int(Path(marks, "pid-0").read_text())
        os.kill(pid, signal.SIGKILL)
        Path(marks, "killed").write_text(str(pid))
        if mode == "running":
            wait_until(lambda: logged(instance, "reattached to invocation"), 240,
                       "the retried step to attach")
        if mode != "drained":
            Path(marks, "go").write_text("")
    except BaseException as exc:  # noqa: BLE001 - reported by the test's assertion
        failures.append(exc)
        Path(marks, "go").write_text("")


def _run_with_a_kill(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     marks: str, mode: str) -> tuple[Any, list[str], list[Any]]:
    """Run the job under the multiprocess executor while :func:`_killer` kills its step:
    the result, the run's log messages and its materializations."""
    settings = {
        **env, "DSLURM_TEST_SESSION": "bash", "DSLURM_TEST_MARKS": marks,
        "DSLURM_TEST_PREPARE": write_payload(tmp_path, "prepare.py", PREPARE_PAYLOAD),
        "DSLURM_TEST_PAYLOAD": write_payload(tmp_path, "units.py", UNITS_PAYLOAD),
        "DSLURM_TEST_MODE": mode,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(HERE)  # step processes import this module from the working directory
    failures: list[BaseException] = []
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        killer = threading.Thread(target=_killer, daemon=True,
                                  args=(instance, marks, mode, failures))
        killer.start()
        result = dg.execute_job(dg.reconstructable(reattach_job), instance=instance)
        logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
        materialized = result.get_asset_materialization_events()
    killer.join(10)
    assert not failures, failures
    return result, logs, materialized


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["running", "finished", "drained"])
def test_a_killed_step_reattaches_to_its_payload(env, tmp_path, monkeypatch, mode):
    base = env["SLURM_DEPLOYMENT_BASE_PATH"]
    marks = f"{base}/test-marks/reattach-{uuid.uuid4().hex[:8]}"  # seen by every node
    slurm = slurm_resource(env)  # the directory belongs to the job's user
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    slurm.close()
    try:
        result, logs, materialized = _run_with_a_kill(env, tmp_path, monkeypatch, marks, mode)
        assert result.success, logs
        assert Path(marks, "killed").read_text() == Path(marks, "pid-0").read_text()
        assert os.path.exists(f"{marks}/pid-1"), "the step was not retried"
        # the payload started once; the preparation (consumed by the killed attempt) twice
        assert len(_lines(f"{marks}/starts")) == 1, _lines(f"{marks}/starts")
        assert len(_lines(f"{marks}/prepare-starts")) == 2
        assert not os.path.exists(f"{marks}/custom-0.json"), "the killed attempt finished"
        reported = json.loads(Path(marks, "custom-1.json").read_text())
        assert reported["prepare"] == [{"prepared": True}]
        assert len(materialized) == 1
        metadata = materialized[0].event_specific_data.materialization.metadata
        if mode == "drained":
            assert _lines(f"{marks}/units") == ["0", "1", "2"]
            assert reported["units"] == [{"unit": 0}, {"unit": 1}, {"unit": 2},
                                         {"drained_after": 2, "signals": 1}]
            assert reported["exit_code"] == 0 and reported["drain_signal"] == "TERM"
            assert metadata["drained"].value is True
        else:
            assert _lines(f"{marks}/units") == [str(unit) for unit in range(UNITS)]
            assert reported["units"] == [{"unit": unit} for unit in range(UNITS)]
            assert metadata["units"].value == UNITS
        reattached = [m for m in logs if "reattached to invocation" in m]
        assert len(reattached) == 1, logs
        if mode == "running":  # the payload went past its third unit only after the attach
            unit_3 = next(i for i, m in enumerate(logs) if f"unit 3 of {UNITS}" in m)
            assert logs.index(reattached[0]) < unit_3, logs
        requested = [m for m in logs if m.startswith("Step relayed requested in run allocation")]
        assert len(requested) == 3, requested  # prepare twice, the payload once
        assert len({m.split(";")[0] for m in requested}) == 1, "one allocation"
        # every call record was removed with its invocation (no defer_cleanup)
        assert not glob.glob(f"{base}/sessions/{result.run_id}-*/jobs/*/calls/*/*.json")
        wait_until(lambda: not active_jobs(env, f"dsr-{result.run_id}"), 60,
                   "the run allocation to end")
    finally:
        shutil.rmtree(marks, ignore_errors=True)
