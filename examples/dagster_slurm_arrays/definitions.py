"""The array example's Dagster definitions: one asset over 200 partitions whose single-run
backfill runs as one Slurm job array (a pool of processes in local mode); see
docs/arrays.md and examples/README.md."""

import os
import tempfile
from pathlib import Path

import dagster as dg

from dagster_slurm import ComputeResource, SlurmQueueConfig, SlurmResource

PAYLOAD = Path(__file__).parent / "payloads" / "partition.py"

KEYS = [f"sample-{i:03d}" for i in range(200)]
#: Keys whose first try fails on purpose (exit code 3); their next try succeeds.
FAILING = ["sample-007", "sample-008", "sample-042", "sample-150"]


class SamplesConfig(dg.Config):
    """Where the payload writes, which keys fail on their first try, and the array's
    settings (None: the queue's array_parallelism in slurm mode, the CPU count locally)."""

    work_dir: str = ""
    fail_first_try: list[str] = FAILING
    array_parallelism: int | None = None
    array_retries: int = 0


def work_dir_of(config: SamplesConfig, compute: ComputeResource) -> str:
    """``config.work_dir``, else a directory every task sees: under the cluster's base path
    in slurm mode, the temporary directory in local mode."""
    if config.work_dir:
        return config.work_dir
    if compute.mode == "local" or compute.slurm is None:
        return os.path.join(tempfile.gettempdir(), "dagster-slurm-arrays")
    return f"{compute.slurm.base_path()}/arrays-example"


@dg.asset(
    partitions_def=dg.StaticPartitionsDefinition(KEYS),
    backfill_policy=dg.BackfillPolicy.single_run(),
    description="One sample per partition, computed by one task of a Slurm job array.",
)
def samples(context: dg.AssetExecutionContext, config: SamplesConfig,
            compute: ComputeResource):
    yield from compute.run(
        context=context,
        payload_path=str(PAYLOAD),
        extras={"work_dir": work_dir_of(config, compute),
                "fail_first_try": config.fail_first_try},
        array_parallelism=config.array_parallelism,
        array_retries=config.array_retries,
    ).get_results()


def arrays_compute() -> ComputeResource:
    """Local mode unless DAGSTER_SLURM_MODE=slurm (then the SLURM_EDGE_NODE_* variables):
    asset scope, at most 20 tasks of an array at once."""
    if os.environ.get("DAGSTER_SLURM_MODE", "local") == "local":
        return ComputeResource(mode="local")
    env_path = os.environ.get("DAGSTER_SLURM_ENV_PATH") or None
    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION") or None,
                             time_limit="00:10:00", cpus=1, mem="500M", array_parallelism=20)
    return ComputeResource(
        mode="slurm",
        slurm=SlurmResource.from_env(queue=queue),
        pre_deployed_env_path=env_path,
        env_packages=None if env_path else ["dagster-pipes"],
    )


defs = dg.Definitions(assets=[samples], resources={"compute": arrays_compute()})
