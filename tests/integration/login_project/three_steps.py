"""A run of three chained Slurm assets under the multiprocess executor (one process per
step), and one tick of the orphan sensor: what a deployment's processes do.

``python three_steps.py run`` executes the job once and exits 0 when it succeeded;
``python three_steps.py sensor`` evaluates the orphan sensor once. The cluster comes from
the ``SLURM_EDGE_NODE_*`` variables; ``LOGIN_PROJECT_PAYLOAD`` names the payload script.
"""

import os
import sys
import tempfile

import dagster as dg

from dagster_slurm import (
    ComputeResource,
    SlurmQueueConfig,
    SlurmResource,
    build_slurm_orphan_reconcile_sensor,
)


def _compute() -> ComputeResource:
    queue = SlurmQueueConfig(partition="cpu", time_limit="00:05:00", mem="100M", cpus=1)
    return ComputeResource(mode="slurm", slurm=SlurmResource.from_env(queue=queue))


def _step(name: str, upstream: str | None) -> dg.AssetsDefinition:
    @dg.asset(name=name, deps=[upstream] if upstream else [])
    def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        payload = os.environ["LOGIN_PROJECT_PAYLOAD"]
        yield from compute.run(context=context, payload_path=payload).get_results()

    return _asset


def three_steps() -> dg.JobDefinition:
    """The job, rebuilt in every step process."""
    return dg.Definitions(
        assets=[_step("first", None), _step("second", "first"), _step("third", "second")],
        resources={"compute": _compute()},
        jobs=[dg.define_asset_job("three_steps", executor_def=dg.multiprocess_executor)],
    ).resolve_job_def("three_steps")


def run() -> int:
    with dg.DagsterInstance.local_temp(tempfile.mkdtemp()) as instance:
        result = dg.execute_job(dg.reconstructable(three_steps), instance=instance)
        return 0 if result.success else 1


def sensor_tick() -> int:
    sensor = build_slurm_orphan_reconcile_sensor(slurm=_compute().slurm)
    with dg.DagsterInstance.ephemeral() as instance:
        result = sensor(dg.build_sensor_context(instance=instance))
        print(getattr(result, "skip_message", result))
    return 0


if __name__ == "__main__":
    sys.exit(run() if sys.argv[1] == "run" else sensor_tick())
