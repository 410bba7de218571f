"""compute.run_hetjob on the dev cluster: one heterogeneous job, a CPU and a GPU component."""


import dagster as dg
import pytest
from compute_support import compute, squeue_names, write_payload

from dagster_slurm import HetJobComponent
from dagster_slurm.compute.resource import ComputeResource

pytestmark = pytest.mark.integration

# Reports what the payload is told about each component, and what a step on component 1
# sees of its GPU.
PAYLOAD_COMPONENTS = """
import os
import subprocess
from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    step = subprocess.run(
        ["srun", "--het-group=1", "--ntasks=1", "bash", "-c",
         'echo "$SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none}"'],
        capture_output=True, text=True, check=True,
    )
    gpu_host, gpu_devices = step.stdout.split()
    pipes.report_asset_materialization(metadata={
        "het_size": os.environ["SLURM_HET_SIZE"],
        "nodes_0": os.environ["SLURM_JOB_NODELIST_HET_GROUP_0"],
        "nodes_1": os.environ["SLURM_JOB_NODELIST_HET_GROUP_1"],
        "partition_1": os.environ["SLURM_JOB_PARTITION_HET_GROUP_1"],
        "gpu_host": gpu_host,
        "gpu_devices": gpu_devices,
    })
"""


def test_cpu_and_gpu_components_reach_the_payload(slurm_cluster, tmp_path):
    env = slurm_cluster.env()
    payload = write_payload(tmp_path, "components.py", PAYLOAD_COMPONENTS)

    @dg.asset
    def het_asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run_hetjob(
            context,
            components=[
                HetJobComponent(partition=env.get("SLURM_PARTITION", "cpu"), mem="500M"),
                HetJobComponent(partition=env.get("SLURM_GPU_PARTITION", "gpu"), mem="500M",
                                cpus_per_task=1, gpus_per_node=1),
            ],
            payload_path=payload,
        ).get_results()

    result = dg.materialize([het_asset], resources={"compute": compute(env)})

    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = {key: value.value for key, value in event.materialization.metadata.items()}
    assert metadata["het_size"] == "2"
    assert metadata["nodes_0"].startswith("c") and metadata["nodes_1"].startswith("g")
    assert metadata["partition_1"] == env.get("SLURM_GPU_PARTITION", "gpu")
    assert metadata["gpu_host"] == metadata["nodes_1"]
    assert metadata["gpu_devices"] != "none"
    # The job is followed and accounted under its own id, its component lines folded into it.
    assert metadata["dagster_slurm/job_id"].isdigit()
    assert metadata["dagster_slurm/state"] == "COMPLETED"
    assert not [line for line in squeue_names(env) if "het_asset" in line]
