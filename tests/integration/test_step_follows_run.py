"""A step follows its own Dagster run (dev cluster, real Dagster instance).

While a step waits on its Slurm job (asset scope) or its job step (run scope), another
process marks the run FAILURE, as Dagster's run monitoring does when the run worker was
SIGKILLed. The step must cancel its Slurm work and fail without a materialization, even
though the payload had already reported one through Pipes.
"""

import subprocess
import threading

import dagster as dg
import pytest
from compute_support import (
    compute,
    logged,
    slurm_resource,
    squeue_names,
    step_failure,
    wait_until,
    write_payload,
)

from dagster_slurm import ComputeResource, SlurmRunAllocationConfig
from dagster_slurm.devcluster.info import slurm_command

pytestmark = pytest.mark.integration

# Reports a materialization at once, then runs until its job is cancelled.
PAYLOAD = """
import time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"early": 1})
    pipes.log.info("materialization reported; now waiting")
    time.sleep(300)
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()



def _materialize_in_thread(payload: str, resource, instance):
    outcome = {}

    @dg.asset(name="followed")
    def followed(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    def target():
        outcome["result"] = dg.materialize([followed], resources={"compute": resource},
                                           instance=instance, raise_on_error=False)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _fail_run_when_reported(instance) -> str:
    """Once the payload said it reported its materialization, mark the run FAILURE from
    outside the step (the run worker's death as Dagster records it); returns the run id."""
    wait_until(lambda: logged(instance, "materialization reported"), 180, "the payload")
    (run,) = instance.get_runs()
    instance.report_run_failed(run, "the run worker died (simulated by the test)")
    return run.run_id


def _squeue_ids(env, name_prefix: str) -> list[str]:
    out = subprocess.run([slurm_command(env, "squeue"), "-h", "-o", "%i|%j"], capture_output=True, text=True,
                         check=True, env={"SLURM_CONF": env["SLURM_CONF"]}).stdout
    return [line.split("|")[0] for line in out.split() if line.split("|")[1].startswith(name_prefix)]


def test_asset_scope_step_cancels_its_job_when_its_run_failed(env, tmp_path):
    payload = write_payload(tmp_path, "wait.py", PAYLOAD)
    instance = dg.DagsterInstance.ephemeral()
    thread, outcome = _materialize_in_thread(payload, compute(env, run_status_interval=1.0),
                                             instance)
    run_id = _fail_run_when_reported(instance)
    thread.join(120)
    assert not thread.is_alive(), "the step did not stop waiting"
    # the job is gone at once (scancel before the step failed), not at its walltime
    assert not [r for r in squeue_names(env, f"dsl-{run_id[:8]}") if "RUNNING" in r]
    result = outcome["result"]
    assert not result.get_asset_materialization_events()
    assert "DagsterRunEnded" in step_failure(result)
    assert "FAILURE" in step_failure(result)


@pytest.mark.release_subset
def test_run_scope_step_cancels_its_step_and_teardown_its_allocation(env, tmp_path):
    payload = write_payload(tmp_path, "wait.py", PAYLOAD)
    instance = dg.DagsterInstance.ephemeral()
    resource = ComputeResource(
        mode="slurm", slurm=slurm_resource(env), allocation_scope="run",
        run_allocation=SlurmRunAllocationConfig(heartbeat_interval=2.0),
        env_packages=["dagster-pipes"], run_status_interval=1.0,
    )
    thread, outcome = _materialize_in_thread(payload, resource, instance)
    run_id = _fail_run_when_reported(instance)
    thread.join(120)
    assert not thread.is_alive(), "the step did not stop waiting"
    # teardown saw a FAILURE run and cancelled the allocation
    wait_until(lambda: not _squeue_ids(env, f"dsr-{run_id}"), 30, "the allocation to end")
    result = outcome["result"]
    assert not result.get_asset_materialization_events()
    assert "DagsterRunEnded" in step_failure(result)
