"""Assets that run through ComputeResource, locally or on Slurm, configured from env vars."""


import importlib.metadata
import importlib.util
import os
from pathlib import Path

import dagster as dg

from dagster_slurm import ComputeResource, RayLauncher, SlurmQueueConfig, SlurmResource

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


@dg.asset(description="Runs a Ray payload on a Ray cluster started for it (needs the ray extra).")
def ray_sum(context: dg.AssetExecutionContext, compute: ComputeResource):
    yield from compute.run(
        context=context,
        payload_path=str(PAYLOADS / "ray_sum.py"),
        launcher=RayLauncher(include_dashboard=False),
        extra_slurm_opts={"nodes": 2, "mem": "2500M"},
    ).get_results()


def compute_resource() -> ComputeResource:
    """Local mode unless DAGSTER_SLURM_MODE=slurm (then the SLURM_EDGE_NODE_* variables)."""
    mode = os.environ.get("DAGSTER_SLURM_MODE", "local")
    if mode == "local":
        return ComputeResource(mode="local")
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
    return ComputeResource(
        mode="slurm",
        slurm=SlurmResource.from_env(queue=queue),
        pre_deployed_env_path=env_path,
        env_packages=None if env_path else packages,
    )


#: The Ray asset is part of the project where ray is installed (pip install "dagster-slurm[ray]").
RAY_AVAILABLE = importlib.util.find_spec("ray") is not None
ASSETS = [shell_report, squares, *([ray_sum] if RAY_AVAILABLE else [])]

defs = dg.Definitions(assets=ASSETS, resources={"compute": compute_resource()})
