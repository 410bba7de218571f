"""Assets that run through ComputeResource, locally or on Slurm, configured from env vars.

Three launchers, one resource each: ``compute`` (Bash, the default launcher) for
``shell_report`` and ``squares``, ``compute_ray`` (a RayLauncher) for ``ray_sum`` and
``compute_spark`` (a SparkLauncher) for ``spark_sum``. The Ray and Spark assets are part of
the project only where they can run; :data:`SKIPPED` says which were left out and why.
"""


import importlib.metadata
import os
from pathlib import Path
from typing import Any

import dagster as dg

from dagster_slurm import (
    ComputeResource,
    RayLauncher,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
)
from dagster_slurm_example.availability import Skipped, ray_missing, spark_missing

try:
    from dagster_slurm import SparkLauncher
except ImportError:  # a dagster-slurm without Spark support: spark_sum is skipped
    SparkLauncher = None

PAYLOADS = Path(__file__).parent / "payloads"


@dg.asset(description="Runs a Bash payload and keeps its output in the compute logs.")
def shell_report(context: dg.AssetExecutionContext, compute: ComputeResource):
    yield from compute.run(context=context, payload_path=str(PAYLOADS / "report.sh")).get_results()


@dg.asset(
    description="Runs a Python payload that reports metadata and an asset check via Pipes.",
    check_specs=[dg.AssetCheckSpec("squares_are_positive", asset="squares")],
    deps=[shell_report],
)
def squares(context: dg.AssetExecutionContext, compute: ComputeResource):
    yield from compute.run(
        context=context, payload_path=str(PAYLOADS / "squares.py"), extras={"count": 12}
    ).get_results()


#: The Ray asset's shape. With SLURM_ALLOCATION_SCOPE=run the run allocation has the same
#: shape, so the asset's extra_slurm_opts match it (a step cannot ask for another shape).
RAY_NODES = 2
RAY_MEM = "2500M"


@dg.asset(
    description=(
        "Runs a Ray payload on a Ray cluster started for its step, or once per run with "
        "SLURM_ALLOCATION_SCOPE=run (needs the ray extra)."
    )
)
def ray_sum(context: dg.AssetExecutionContext, compute_ray: ComputeResource):
    yield from compute_ray.run(
        context=context,
        payload_path=str(PAYLOADS / "ray_sum.py"),
        extra_slurm_opts={"nodes": RAY_NODES, "mem": RAY_MEM},
    ).get_results()


#: The Spark asset's shape: one node, its Spark driver and executors inside the job.
SPARK_NODES = 1
SPARK_MEM = "2000M"


@dg.asset(
    description=(
        "Runs a PySpark payload: Spark's local[*] master in local mode, a Spark cluster "
        "started in the asset's own Slurm job otherwise (needs pyspark and Java)."
    )
)
def spark_sum(context: dg.AssetExecutionContext, compute_spark: ComputeResource):
    yield from compute_spark.run(
        context=context,
        payload_path=str(PAYLOADS / "spark_sum.py"),
        extra_slurm_opts={"nodes": SPARK_NODES, "mem": SPARK_MEM},
    ).get_results()


def spark_launcher() -> Any:
    """The Spark asset's launcher: small driver and executors that fit the dev cluster's
    nodes. Only called where SparkLauncher exists."""
    return SparkLauncher(driver_memory="512m", executor_memory="512m", executor_cores=1)


def allocation_scope() -> str:
    """SLURM_ALLOCATION_SCOPE: 'asset' (default, one Slurm job per step) or 'run' (the Ray
    asset's steps share one allocation per Dagster run, with Ray started once in it)."""
    scope = os.environ.get("SLURM_ALLOCATION_SCOPE") or "asset"
    if scope not in ("asset", "run"):
        raise ValueError(f"SLURM_ALLOCATION_SCOPE={scope!r}: use 'asset' or 'run'")
    return scope


def _slurm_settings() -> dict[str, Any]:
    """What the project's Slurm-mode resources share: cluster, queue settings, environment."""
    queue = SlurmQueueConfig(
        partition=os.environ.get("SLURM_PARTITION") or None,
        time_limit="00:10:00",
        cpus=1,
        mem="500M",
    )
    env_path = os.environ.get("DAGSTER_SLURM_ENV_PATH") or None
    packages = ["dagster-pipes"]
    if RAY_MISSING is None:
        packages.append(f"ray[default]=={importlib.metadata.version('ray')}")
    if SPARK_MISSING is None:
        packages.append(f"pyspark=={importlib.metadata.version('pyspark')}")
    return {
        "slurm": SlurmResource.from_env(queue=queue),
        "pre_deployed_env_path": env_path,
        "env_packages": None if env_path else packages,
    }


def compute_resources() -> dict[str, ComputeResource]:
    """'compute' for the Bash and Python assets, 'compute_ray' (a RayLauncher) for ray_sum,
    'compute_spark' (a SparkLauncher) for spark_sum where SparkLauncher exists.

    Local mode unless DAGSTER_SLURM_MODE=slurm (then the SLURM_EDGE_NODE_* variables).
    SLURM_ALLOCATION_SCOPE=run puts 'compute_ray' in run scope, and only it: 'compute' and
    'compute_spark' keep one Slurm job per step. Local mode runs every payload as a
    subprocess whatever the scope.
    """
    scope = allocation_scope()
    ray = RayLauncher(include_dashboard=False)
    spark = {} if SparkLauncher is None else {"default_launcher": spark_launcher()}
    if os.environ.get("DAGSTER_SLURM_MODE", "local") == "local":
        return {
            "compute": ComputeResource(mode="local"),
            "compute_ray": ComputeResource(mode="local", default_launcher=ray),
            "compute_spark": ComputeResource(mode="local", **spark),
        }
    settings = _slurm_settings()
    if scope == "run":
        compute_ray = ComputeResource(
            mode="slurm",
            default_launcher=ray,
            allocation_scope="run",
            # Fields left out (partition, time limit, CPUs) come from the queue settings.
            run_allocation=SlurmRunAllocationConfig(num_nodes=RAY_NODES, mem=RAY_MEM),
            **settings,
        )
    else:
        compute_ray = ComputeResource(mode="slurm", default_launcher=ray, **settings)
    return {
        "compute": ComputeResource(mode="slurm", **settings),
        "compute_ray": compute_ray,
        "compute_spark": ComputeResource(mode="slurm", **spark, **settings),
    }


#: Why the optional assets cannot run here (None: they can).
RAY_MISSING = ray_missing()
SPARK_MISSING = spark_missing(SparkLauncher)

#: The assets left out of the project on this machine, with the reason for each.
SKIPPED = tuple(
    Skipped(asset, reason)
    for asset, reason in (("ray_sum", RAY_MISSING), ("spark_sum", SPARK_MISSING))
    if reason is not None
)
ASSETS = [
    shell_report,
    squares,
    *([ray_sum] if RAY_MISSING is None else []),
    *([spark_sum] if SPARK_MISSING is None else []),
]
RESOURCES = compute_resources()

defs = dg.Definitions(assets=ASSETS, resources=RESOURCES)
