"""A real Dagster deployment on the dev cluster: ``dagster dev`` (webserver, daemon, code
server) on 127.0.0.1 serving ``deploy_project/definitions.py``, runs launched and stopped
through GraphQL, the default multiprocess executor.

What is shown: a run succeeds with its materialization; ``terminateRun`` cancels the Slurm
job within seconds; after SIGKILL of the run worker (the pid of the run's "Started process
for run" event) no Slurm job is left and the FAILURE run records no materialization, in
asset scope and in run scope, with the orphan sensor on and off; after SIGKILL of a step
process the orphan sensor cancels its job. Nothing the test started outlives it. How long
each cleanup took is printed at the end of the module.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import dagster as dg
import pytest
from deploy_support import (
    Deployment,
    alive,
    events_of,
    messages,
    run_worker_pid,
    session_members,
    step_pids,
    wait_for,
)
from session_support import active_jobs

from dagster_slurm.devcluster.info import slurm_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SENSOR = "slurm_orphan_reconcile_sensor"
#: Generous bounds that mean "it happened" (the cleanups take seconds; see the printout).
FIRST_RUN_TIMEOUT = 240.0  # the first run may pack and upload the payload's environment
JOB_RUNNING_TIMEOUT = 180.0
CLEANUP_TIMEOUT = 90.0

TIMINGS: list[tuple[str, str, float]] = []


def _timed(scenario: str, what: str, since: float) -> float:
    took = time.monotonic() - since
    TIMINGS.append((scenario, what, took))
    return took


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@pytest.fixture(scope="module")
def deployment(env, tmp_path_factory, request) -> Iterator[Deployment]:
    if importlib.util.find_spec("dagster_webserver") is None:
        pytest.fail(f"dagster-webserver is not installed for {sys.executable}; it is part of "
                    "the dev extra (pip install -e '.[dev]')", pytrace=False)
    dev = Deployment(home=tmp_path_factory.mktemp("dagster_home"),
                     env={**env, "DEPLOY_TEST_SENSOR_INTERVAL": "5"})
    try:
        dev.start()
        yield dev
    finally:
        killed = dev.stop()
        lines = [f"{scenario:<46} {what:<32} {took:6.1f} s" for scenario, what, took in TIMINGS]
        lines.append(f"{'dagster dev':<46} {'stopped, all its processes gone':<32} "
                     f"{dev.stop_seconds or 0:6.1f} s (SIGKILLed after Ctrl-C: {killed})")
        _print_past_capture(request, ["", "cleanup times (test_deployment):",
                                      *("  " + line for line in lines)])
        assert dev.proc is not None and not session_members(dev.proc.pid)


def _print_past_capture(request: pytest.FixtureRequest, lines: list[str]) -> None:
    """Print ``lines`` to the terminal even while pytest captures output."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        print("\n".join(lines))
        return
    with capture.global_and_fixture_disabled():
        for line in lines:
            reporter.write_line(line)


def _scancel(env: dict[str, str], job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run([slurm_command(env, "scancel"), *job_ids], check=False, timeout=30,
                       env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"})


def _prefix(run_id: str, scope: str) -> str:
    return f"dsl-{run_id[:8]}-" if scope == "asset" else f"dsr-{run_id}"


def _held_job_running(dev: Deployment, env: dict[str, str], run_id: str,
                      prefix: str) -> str:
    """Wait until the held payload runs (its Pipes log arrived, its job is RUNNING); the job id."""
    instance = dev.instance()
    wait_for(f"run {run_id}'s payload running", lambda: any(
        m.startswith("payload running in job") for m in messages(instance, run_id)),
        JOB_RUNNING_TIMEOUT, 1.0)
    running = wait_for(f"a RUNNING job named {prefix}*", lambda: [
        job for job, _, state in active_jobs(env, prefix) if state == "RUNNING"], 30)
    return running[0]


def _materializations(dev: Deployment, run_id: str) -> list[object]:
    return events_of(dev.instance(), run_id, dg.DagsterEventType.ASSET_MATERIALIZATION)


def test_a_run_succeeds_with_its_materialization(deployment, env):
    started = time.monotonic()
    run_id = deployment.launch("quick_job")
    status = deployment.wait_status(run_id, {"SUCCESS", "FAILURE", "CANCELED"},
                                    FIRST_RUN_TIMEOUT)
    _timed("normal run", "launch to SUCCESS", started)
    assert status == "SUCCESS", messages(deployment.instance(), run_id)[-20:]
    (record,) = _materializations(deployment, run_id)
    materialization = record.event_log_entry.dagster_event.event_specific_data.materialization
    assert materialization.asset_key == dg.AssetKey("quick")
    assert materialization.metadata["slurm_job_id"].value
    assert not active_jobs(env, _prefix(run_id, "asset"))


def test_terminate_run_cancels_the_slurm_job(deployment, env):
    run_id = deployment.launch("held_job")
    prefix = _prefix(run_id, "asset")
    try:
        job_id = _held_job_running(deployment, env, run_id, prefix)
        started = time.monotonic()
        deployment.terminate(run_id)
        wait_for(f"job {job_id} out of the queue after terminateRun",
                 lambda: not active_jobs(env, prefix), CLEANUP_TIMEOUT)
        _timed("terminateRun (asset scope)", "terminateRun to job gone", started)
        status = deployment.wait_status(run_id, {"CANCELED", "FAILURE", "SUCCESS"},
                                        CLEANUP_TIMEOUT)
        _timed("terminateRun (asset scope)", "terminateRun to run CANCELED", started)
        assert status == "CANCELED"
        assert not _materializations(deployment, run_id)
    finally:
        _scancel(env, [job for job, _, _ in active_jobs(env, prefix)])


@pytest.mark.parametrize(("scope", "sensor"), [
    ("asset", False), ("asset", True), ("run", False), ("run", True),
], ids=["asset-scope-sensor-off", "asset-scope-sensor-on",
        "run-scope-sensor-off", "run-scope-sensor-on"])
def test_sigkill_of_the_run_worker_leaves_no_job_and_no_materialization(
        deployment, env, scope, sensor):
    scenario = f"SIGKILL run worker ({scope} scope, sensor {'on' if sensor else 'off'})"
    sensor_id = deployment.start_sensor(SENSOR) if sensor else None
    run_id = deployment.launch("held_job" if scope == "asset" else "held_in_run_job")
    prefix = _prefix(run_id, scope)
    steps: list[int] = []
    try:
        job_id = _held_job_running(deployment, env, run_id, prefix)
        instance = deployment.instance()
        worker = run_worker_pid(instance, run_id)
        steps = step_pids(instance, run_id)
        assert worker is not None and alive(worker), worker
        assert steps and worker not in steps, (worker, steps)
        started = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        status = deployment.wait_status(run_id, {"FAILURE", "CANCELED", "SUCCESS"},
                                        CLEANUP_TIMEOUT)
        _timed(scenario, "SIGKILL to run FAILURE", started)
        assert status == "FAILURE"
        wait_for(f"job {job_id} out of the queue", lambda: not active_jobs(env, prefix),
                 CLEANUP_TIMEOUT)
        _timed(scenario, "SIGKILL to Slurm job gone", started)
        wait_for(f"step processes {steps} ended", lambda: not any(alive(p) for p in steps),
                 CLEANUP_TIMEOUT)
        _timed(scenario, "SIGKILL to step process ended", started)
        assert not _materializations(deployment, run_id)
        assert not events_of(deployment.instance(), run_id, dg.DagsterEventType.STEP_SUCCESS)
        assert deployment.status(run_id) == "FAILURE"
    finally:
        if sensor_id is not None:
            deployment.stop_sensor(sensor_id)
        _scancel(env, [job for job, _, _ in active_jobs(env, prefix)])
        ours = set(session_members(deployment.proc.pid)) if deployment.proc else set()
        for pid in steps:  # a step left waiting would otherwise live until dagster dev stops
            if pid in ours:
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("scope", ["asset", "run"], ids=["asset-scope", "run-scope"])
def test_sigkill_of_a_step_process_leaves_its_job_to_the_orphan_sensor(deployment, env, scope):
    scenario = f"SIGKILL step process ({scope} scope, sensor on)"
    sensor_id = deployment.start_sensor(SENSOR)
    run_id = deployment.launch("held_job" if scope == "asset" else "held_in_run_job")
    prefix = _prefix(run_id, scope)
    try:
        job_id = _held_job_running(deployment, env, run_id, prefix)
        (step,) = step_pids(deployment.instance(), run_id)
        assert step in session_members(deployment.proc.pid), step
        started = time.monotonic()
        os.kill(step, signal.SIGKILL)
        status = deployment.wait_status(run_id, {"FAILURE", "CANCELED", "SUCCESS"},
                                        CLEANUP_TIMEOUT)
        _timed(scenario, "SIGKILL to run FAILURE", started)
        assert status == "FAILURE"
        # nothing in the dead step can cancel the job: the sensor's next tick does
        wait_for(f"job {job_id} out of the queue", lambda: not active_jobs(env, prefix),
                 CLEANUP_TIMEOUT)
        _timed(scenario, "SIGKILL to Slurm job gone", started)
        assert not _materializations(deployment, run_id)
    finally:
        deployment.stop_sensor(sensor_id)
        _scancel(env, [job for job, _, _ in active_jobs(env, prefix)])
