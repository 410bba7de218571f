"""Assets that run through ComputeResource, locally or on Slurm, configured from env vars."""


import importlib.metadata
import importlib.util
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
    if RAY_AVAILABLE:
        packages.append(f"ray[default]=={importlib.metadata.version('ray')}")
    return {
        "slurm": SlurmResource.from_env(queue=queue),
        "pre_deployed_env_path": env_path,
        "env_packages": None if env_path else packages,
    }


def compute_resources() -> dict[str, ComputeResource]:
    """'compute' for the Bash and Python assets, 'compute_ray' (a RayLauncher) for ray_sum.

    Local mode unless DAGSTER_SLURM_MODE=slurm (then the SLURM_EDGE_NODE_* variables).
    SLURM_ALLOCATION_SCOPE=run puts 'compute_ray' in run scope; local mode runs every
    payload as a subprocess whatever the scope.
    """
    scope = allocation_scope()
    ray = RayLauncher(include_dashboard=False)
    if os.environ.get("DAGSTER_SLURM_MODE", "local") == "local":
        return {
            "compute": ComputeResource(mode="local"),
            "compute_ray": ComputeResource(mode="local", default_launcher=ray),
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
    return {"compute": ComputeResource(mode="slurm", **settings), "compute_ray": compute_ray}


#: The Ray asset is part of the project where ray is installed (pip install "dagster-slurm[ray]").
RAY_AVAILABLE = importlib.util.find_spec("ray") is not None
ASSETS = [shell_report, squares, *([ray_sum] if RAY_AVAILABLE else [])]

defs = dg.Definitions(assets=ASSETS, resources=compute_resources())
