"""Drain reaches running steps of a run allocation (dev cluster, real srun and scancel).

A payload step that traps the drain signal finishes its unit of work and exits 0 while the
allocation (and its step server) stays alive; a step started after the drain is answered
without running; a step that is still starting when the drain arrives gets it once it runs.
"""

import os
import shlex
import shutil
import subprocess
import threading
import uuid

import pytest
from compute_support import slurm_resource, squeue_state, wait_until

from dagster_slurm import SlurmAllocationEnded, SlurmRunAllocationConfig
from dagster_slurm.agent import write_file_op
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.session import RunSession

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()




def _unit_worker(marks: str, signal_name: str) -> list[str]:
    """A payload that works in units of 1 s; on the drain signal it finishes the unit it is
    in, writes how far it got, and exits 0."""
    script = f"""
        marks={shlex.quote(marks)}
        drained=""
        trap 'drained=1' {signal_name}
        echo started > "$marks/started"
        for unit in $(seq 1 120); do
            sleep 1 & wait $! || wait $!
            echo "$unit" >> "$marks/units"
            if [ -n "$drained" ]; then echo "stopped after unit $unit" > "$marks/stopped"; exit 0; fi
        done
        exit 3
    """
    return ["bash", "-c", script]


@pytest.mark.parametrize("drain", ["TERM", "USR1"])
def test_a_running_step_finishes_its_unit_on_drain_and_the_allocation_stays(env, drain):
    slurm = slurm_resource(env)
    config = SlurmRunAllocationConfig(
        heartbeat_timeout=120, heartbeat_interval=5,
        signal_before_timeout=None if drain == "TERM" else f"{drain}@30",
    )
    session = RunSession(slurm, str(uuid.uuid4()), config, BashLauncher(), activation=lambda: None)
    marks = f"{slurm.base_path()}/test-marks/drain-{uuid.uuid4().hex[:8]}"  # seen by every node
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    outcome: dict = {}
    try:
        allocation = session.allocation

        def work():
            try:
                outcome["result"] = session.execute_in_session(_unit_worker(marks, drain),
                                                               name="units")
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = exc

        worker = threading.Thread(target=work)
        worker.start()
        wait_until(lambda: os.path.exists(f"{marks}/units"), 60, "the first unit")
        allocation.request_drain()
        worker.join(60)
        assert not worker.is_alive(), "the drained step did not finish"
        assert "error" not in outcome, f"the drained step failed: {outcome.get('error')}"
        result = outcome["result"]
        assert result.drained and result.drain_signal == drain
        assert result.exit_code == 0, f"the step was killed, not drained: {result}"
        with open(f"{marks}/stopped") as handle:
            assert handle.read().startswith("stopped after unit")
        # the allocation and its server are still there; later steps are refused
        assert squeue_state(env, allocation.job_id) == "RUNNING"
        late = session.execute_in_session(["touch", f"{marks}/late"], name="late")
        assert late.drained and late.exit_code == 0
        assert not os.path.exists(f"{marks}/late")
    finally:
        session.close(cancel=True)
        slurm.close()
        shutil.rmtree(marks, ignore_errors=True)


def test_cancelling_the_allocation_is_not_reported_as_a_drain(env):
    """With TERM as drain signal, scancel of the allocation reaches the step as TERM too;
    the step then reports a drain, but its allocation ended: SlurmAllocationEnded."""
    slurm = slurm_resource(env)
    config = SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5)
    session = RunSession(slurm, str(uuid.uuid4()), config, BashLauncher(), activation=lambda: None)
    marks = f"{slurm.base_path()}/test-marks/cancel-{uuid.uuid4().hex[:8]}"
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    outcome: dict = {}
    try:
        allocation = session.allocation

        def work():
            try:
                outcome["result"] = session.execute_in_session(_unit_worker(marks, "TERM"),
                                                               name="units")
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["error"] = exc

        worker = threading.Thread(target=work)
        worker.start()
        wait_until(lambda: os.path.exists(f"{marks}/units"), 60, "the first unit")
        subprocess.run([slurm_command(env, "scancel"), allocation.job_id], check=True,
                       env={"SLURM_CONF": env["SLURM_CONF"]})
        worker.join(60)
        assert not worker.is_alive()
        error = outcome.get("error")
        assert isinstance(error, SlurmAllocationEnded), outcome
        assert error.result.allocation_state in ("CANCELLED", "COMPLETING")
    finally:
        session.close(cancel=True)
        slurm.close()
        shutil.rmtree(marks, ignore_errors=True)
