"""A separate Ray head on the dev cluster, inside a real Dagster run (real Ray).

``ComputeResource(ray_head_allocation=...)`` runs the Ray head and the payload driver in a
small allocation on ``cpu``; ``run_allocation`` (on ``gpu``) becomes the run's first worker
allocation, submitted once the head is ready. The payload sees the head's Ray node offering
no CPUs and no GPUs and the worker node offering its CPUs and its GPU; a task that asks for
a CPU runs on the worker node, in the worker allocation's Slurm job.
"""

import os
import subprocess

import dagster as dg
import pytest
from compute_support import RAY_PACKAGES, slurm_resource, wait_until
from session_support import active_jobs

from dagster_slurm import ComputeResource, RayLauncher, SlurmRunAllocationConfig
from dagster_slurm.devcluster.info import slurm_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEPARATE_HEAD_PAYLOAD = """
import os, time
import ray
from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR")
    deadline = time.time() + 90
    while True:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        workers = [n for n in nodes if "dagster_slurm_worker" in n["Resources"]]
        if workers or time.time() > deadline:
            break
        time.sleep(0.5)
    (head,) = [n for n in nodes if "dagster_slurm_head" in n["Resources"]]

    @ray.remote(num_cpus=1)
    def where():
        return ray.get_runtime_context().get_node_id(), os.environ.get("SLURM_JOB_ID", "")

    node, job = ray.get(where.remote(), timeout=60)
    pipes.report_asset_materialization(metadata={
        "driver_job": os.environ["SLURM_JOB_ID"],
        "head_node": head["NodeID"],
        "head_cpus": head["Resources"].get("CPU", 0.0),
        "head_gpus": head["Resources"].get("GPU", 0.0),
        "worker_nodes": [w["NodeID"] for w in workers],
        "worker_cpus": sum(w["Resources"].get("CPU", 0.0) for w in workers),
        "worker_gpus": sum(w["Resources"].get("GPU", 0.0) for w in workers),
        "task_node": node,
        "task_job": job,
    })
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _squeue(env: dict[str, str], job_id: str) -> str:
    """``partition|CPUs|memory|GRES`` of a pending or running job, as squeue shows it."""
    return subprocess.run([slurm_command(env, "squeue"), "-h", "-j", job_id, "-o", "%P|%C|%m|%b"],
                          capture_output=True, text=True, check=True,
                          env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}
                          ).stdout.strip()


def test_a_cpu_head_runs_no_work_and_the_worker_allocation_does(env, tmp_path):
    payload = tmp_path / "separate_head.py"
    payload.write_text(SEPARATE_HEAD_PAYLOAD)
    seen: dict = {}
    kwargs: dict = {}
    if os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"):
        kwargs["pre_deployed_env_path"] = os.environ["DAGSTER_SLURM_TEST_RAY_ENV_PATH"]
    else:
        kwargs["env_packages"] = RAY_PACKAGES
    compute = ComputeResource(
        mode="slurm", slurm=slurm_resource(env), allocation_scope="run",
        default_launcher=RayLauncher(include_dashboard=False),
        ray_head_allocation=SlurmRunAllocationConfig(
            partition="cpu", mem="1500M", time_limit="00:10:00", heartbeat_interval=2,
            allow_short_heartbeat_timeout=True),
        run_allocation=SlurmRunAllocationConfig(
            partition="gpu", cpus_per_task=2, mem="2500M", gpus_per_node=1,
            time_limit="00:10:00"),
        **kwargs,
    )

    @dg.asset
    def on_workers(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        seen["head"] = session.allocation.job_id
        seen["name"] = session.job_name
        yield from compute.run(context=context, payload_path=str(payload)).get_results()
        seen["workers"] = dict(session.io.read().doc.workers)
        seen["shapes"] = {job: _squeue(env, job) for job in (seen["head"], *seen["workers"])}

    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        result = dg.materialize([on_workers], resources={"compute": compute}, instance=instance)
        assert result.success
        (event,) = result.get_asset_materialization_events()
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
    # the driver runs in the head allocation; the head's Ray node offers nothing
    assert meta["driver_job"] == seen["head"]
    assert (meta["head_cpus"], meta["head_gpus"]) == (0.0, 0.0)
    # the worker allocation's node joined with its CPUs and its GPU, and ran the task
    (worker_job,) = seen["workers"]
    assert len(meta["worker_nodes"]) == 1
    assert (meta["worker_cpus"], meta["worker_gpus"]) == (2.0, 1.0)
    assert meta["task_node"] in meta["worker_nodes"] and meta["task_node"] != meta["head_node"]
    assert meta["task_job"] == worker_job != seen["head"]
    head_shape, worker_shape = seen["shapes"][seen["head"]], seen["shapes"][worker_job]
    assert head_shape.startswith("cpu|2|1500M|"), head_shape
    assert "gpu" not in head_shape.split("|")[3], head_shape  # no GRES for the head
    assert worker_shape.startswith("gpu|2|2500M|") and "gpu" in worker_shape.split("|")[3]
    # teardown ends every allocation of the session, the worker's too
    wait_until(lambda: not active_jobs(env, seen["name"]), 60, "the session's jobs to end")
