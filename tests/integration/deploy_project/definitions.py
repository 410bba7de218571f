"""The Dagster project that the deployment test serves with ``dagster dev``.

It is an ordinary user project: one asset that finishes at once, one that holds its Slurm
job until it is stopped (asset scope), the same in run scope, and the orphan sensor
(stopped until the test starts it). Everything it needs comes from environment variables:
the ``SLURM_EDGE_NODE_*`` and ``SLURM_DEPLOYMENT_BASE_PATH`` of the cluster,
``DAGSTER_SLURM_TEST_ENV_PATH`` (a pre-deployed payload environment; unset: one is packed
with dagster-pipes) and ``DEPLOY_TEST_SENSOR_INTERVAL`` (the sensor's minimum interval in
seconds, default 60).
"""

import os
from pathlib import Path

import dagster as dg

from dagster_slurm import (
    ComputeResource,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
    build_slurm_orphan_reconcile_sensor,
)

PAYLOAD = str(Path(__file__).parent / "payload.py")

#: The walltime of every job: a job that nothing cancels ends on its own after it.
TIME_LIMIT = "00:04:00"


def _environment() -> dict[str, object]:
    env_path = os.environ.get("DAGSTER_SLURM_TEST_ENV_PATH")
    if env_path:
        return {"pre_deployed_env_path": env_path}
    return {"env_packages": ["dagster-pipes"]}


def _slurm() -> SlurmResource:
    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION") or "cpu",
                             time_limit=TIME_LIMIT, cpus=1, mem="500M")
    return SlurmResource.from_env(queue=queue)


def _asset(name: str, resource_key: str, hold: bool) -> dg.AssetsDefinition:
    @dg.asset(name=name, required_resource_keys={resource_key})
    def _run(context: dg.AssetExecutionContext):
        compute: ComputeResource = getattr(context.resources, resource_key)
        yield from compute.run(
            context=context, payload_path=PAYLOAD, extras={"hold": hold},
        ).get_results()

    return _run


ASSETS = [
    _asset("quick", "compute", hold=False),
    _asset("held", "compute", hold=True),
    _asset("held_in_run", "run_compute", hold=True),
]

compute = ComputeResource(mode="slurm", slurm=_slurm(), **_environment())
run_compute = ComputeResource(
    mode="slurm", slurm=_slurm(), allocation_scope="run",
    run_allocation=SlurmRunAllocationConfig(), **_environment(),
)

orphan_sensor = build_slurm_orphan_reconcile_sensor(
    resource_key="compute",
    minimum_interval_seconds=int(os.environ.get("DEPLOY_TEST_SENSOR_INTERVAL", "60")),
)

defs = dg.Definitions(
    assets=ASSETS,
    resources={"compute": compute, "run_compute": run_compute},
    jobs=[dg.define_asset_job(f"{asset.key.path[-1]}_job", selection=[asset.key])
          for asset in ASSETS],
    sensors=[orphan_sensor],
)
