"""Successor allocations of a run session on the dev cluster (real sbatch, srun, scancel).

The relay: a payload runs in the first allocation, a successor is queued, promotion is
refused while the payload runs, the predecessor drains, the successor is promoted once
RUNNING, the next step runs in it and the predecessor is released; a step prepared against
the predecessor is refused as REPLACED. A pending successor is found by a fresh session
object, promotion refuses it while PENDING, and teardown cancels it. A fresh session object
promotes a successor whose predecessor has ended.
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
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.session import RunSession

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()




def _session(slurm, run_id: str) -> RunSession:
    config = SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5,
                                      time_limit="00:10:00")
    return RunSession(slurm, run_id, config, BashLauncher(), activation=lambda: None)


def _units(marks: str) -> list[str]:
    """Units of 1 s; on TERM (the drain) the unit in progress is finished, then exit 0."""
    script = f"""
        marks={shlex.quote(marks)}
        drained=""
        trap 'drained=1' TERM
        for unit in $(seq 1 120); do
            sleep 1 & wait $! || wait $!
            echo "$unit" >> "$marks/units"
            if [ -n "$drained" ]; then exit 0; fi
        done
        exit 3
    """
    return ["bash", "-c", script]


@pytest.mark.release_subset
def test_relay_drain_promote_and_continue_in_the_successor(env):
    slurm = slurm_resource(env)
    run_id = str(uuid.uuid4())
    session = _session(slurm, run_id)
    marks = f"{slurm.base_path()}/test-marks/relay-{uuid.uuid4().hex[:8]}"
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    outcome: dict = {}
    try:
        predecessor = session.allocation

        def work():
            try:
                outcome["result"] = session.execute_in_session(_units(marks), name="units")
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["error"] = exc

        worker = threading.Thread(target=work)
        worker.start()
        wait_until(lambda: os.path.exists(f"{marks}/units"), 60, "the first unit")
        successor = session.submit_successor(SlurmRunAllocationConfig(time_limit="00:08:00"))
        assert successor.job_id != predecessor.job_id
        with pytest.raises(SessionError, match="second successor|outstanding successor"):
            session.submit_successor()
        wait_until(lambda: squeue_state(env, successor.job_id) == "RUNNING", 60,
                    "the successor to run")
        with pytest.raises(SessionError, match="active payload step"):
            session.promote_successor()
        predecessor.request_drain()
        worker.join(60)
        assert not worker.is_alive() and "error" not in outcome, outcome
        assert outcome["result"].drained and outcome["result"].exit_code == 0

        promoted = session.promote_successor()
        assert promoted.job_id == successor.job_id and session.allocation is promoted
        step = session.execute_in_session(["bash", "-c", 'echo "$SLURM_JOB_ID"'], name="next")
        assert step.exit_code == 0 and not step.drained
        assert step.stdout_tail.strip() == successor.job_id
        wait_until(lambda: squeue_state(env, predecessor.job_id) in ("", "COMPLETING",
                                                                       "CANCELLED"),
                    60, "the predecessor to be released")
        assert session.promote_successor().job_id == successor.job_id  # harmless again
        with pytest.raises(SlurmAllocationEnded) as refused:
            predecessor.execute(["true"], name="stale")
        assert refused.value.result.allocation_state == "REPLACED"
        with open(f"{marks}/units") as handle:
            assert len(handle.read().split()) >= 1
    finally:
        session.close(cancel=True)
        slurm.close()
        shutil.rmtree(marks, ignore_errors=True)


def test_a_pending_successor_is_found_refused_and_cancelled_by_teardown(env):
    slurm = slurm_resource(env)
    run_id = str(uuid.uuid4())
    session = _session(slurm, run_id)
    try:
        predecessor = session.allocation
        successor = session.submit_successor(
            SlurmRunAllocationConfig(extra_sbatch_directives=["--begin=now+1hour"]))
        assert squeue_state(env, successor.job_id) == "PENDING"
        fresh = _session(slurm, run_id)
        with pytest.raises(SessionError, match="PENDING.*requires a RUNNING successor"):
            fresh.promote_successor()
        fresh.close(cancel=False)
        assert squeue_state(env, predecessor.job_id) == "RUNNING"
    finally:
        session.close(cancel=True)
    wait_until(lambda: squeue_state(env, successor.job_id) in ("", "CANCELLED"), 30,
                "teardown to cancel the pending successor")
    slurm.close()


def test_a_fresh_session_promotes_a_successor_whose_predecessor_ended(env):
    slurm = slurm_resource(env)
    run_id = str(uuid.uuid4())
    session = _session(slurm, run_id)
    fresh = None
    try:
        predecessor = session.allocation
        successor = session.submit_successor()
        session.close(cancel=False)  # this process leaves; the session lives on
        subprocess.run([slurm_command(env, "scancel"), predecessor.job_id], check=True,
                       env={"SLURM_CONF": env["SLURM_CONF"]})
        wait_until(lambda: squeue_state(env, successor.job_id) == "RUNNING", 60,
                    "the successor to run")
        fresh = _session(slurm, run_id)
        promoted = fresh.promote_successor()
        assert promoted.job_id == successor.job_id
        step = fresh.execute_in_session(["bash", "-c", 'echo "$SLURM_JOB_ID"'], name="after")
        assert step.stdout_tail.strip() == successor.job_id
    finally:
        (fresh or session).close(cancel=True)
        slurm.close()
