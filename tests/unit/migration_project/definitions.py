"""Definitions written against the published dagster-slurm 1.x API, unchanged.

Everything runs in local mode: the Slurm and SSH resources are built (and checked) but no
connection is opened and nothing is submitted.
"""

import dagster as dg

from dagster_slurm import (
    BashLauncher,
    ComputeResource,
    RayLauncher,
    SlurmQueueConfig,
    SlurmResource,
    SlurmSessionResource,
    SSHConnectionResource,
    build_slurm_orphan_reconcile_sensor,
)

ssh = SSHConnectionResource(
    host="login.cluster.example",
    port=2223,
    user="submitter",
    password="submitter",
    known_hosts_file="~/.ssh/known_hosts",
)

slurm = SlurmResource(
    ssh=ssh,
    queue=SlurmQueueConfig(partition="", num_nodes=1, time_limit="00:30:00", cpus=2, mem="4096M"),
    remote_base="/home/submitter/pipelines/deployments",
)

session = SlurmSessionResource(slurm=slurm, num_nodes=2, time_limit="01:00:00", partition="batch")

ray_launcher = RayLauncher(num_gpus_per_node=0, object_store_memory_gb=2, head_startup_timeout=180)


@dg.asset
def process_data(context: dg.AssetExecutionContext, compute: ComputeResource):
    """The published documentation's first asset: a Python payload run by the Bash launcher."""
    script_path = dg.file_relative_path(__file__, "payloads/process_data.py")
    completed_run = compute.run(
        context=context,
        payload_path=script_path,
        extra_env={"KEY_ENV": "value"},
        extras={"foo": "bar"},
    )
    yield from completed_run.get_results()


defs = dg.Definitions(
    assets=[process_data],
    resources={
        "compute": ComputeResource(mode="local", default_launcher=BashLauncher()),
        "compute_ray": ComputeResource(mode="local", slurm=slurm, default_launcher=ray_launcher),
        "session": session,
    },
    sensors=[build_slurm_orphan_reconcile_sensor(slurm_resource=slurm)],
)
