"""Assets run by the Ray launcher, with a configuration class derived from
``SlurmRunConfig``, and an asset whose metadata names its own environment on the cluster."""

import os

import dagster as dg
from pydantic import Field

from dagster_slurm import ComputeResource, RayLauncher, SlurmRunConfig


class FitConfig(SlurmRunConfig):
    """Settings of the model fit beside the published run configuration."""

    model_dir: str = Field(default="/tmp/models", description="Where the model is written.")
    workers: int = Field(default=2, gt=0, description="Ray workers to use.")


@dg.asset(group_name="models")
def fit_model(context: dg.AssetExecutionContext, compute_ray: ComputeResource,
              config: FitConfig):
    """Fits a model with Ray: a local Ray in development, a Ray cluster on Slurm."""
    completed = compute_ray.run(
        context=context,
        payload_path=dg.file_relative_path(__file__, "../payloads/fit_ray.py"),
        config=config,
        launcher=RayLauncher(num_gpus_per_node=0),
        extra_env={"MODEL_DIR": config.model_dir, "WORKERS": str(config.workers)},
        extra_slurm_opts={"nodes": 1, "cpus_per_task": 2},
    )
    yield from completed.get_results()


@dg.asset(
    group_name="models",
    deps=[fit_model],
    # Migration: the published example built this asset's environment with a command of its
    # own (metadata "slurm_pack_cmd"); here the asset names an environment that exists on
    # the cluster instead.
    metadata={"slurm_pre_deployed_env_path": os.environ.get("SCORING_ENV", "/opt/envs/scoring")},
)
def score_model(context: dg.AssetExecutionContext, compute: ComputeResource,
                config: SlurmRunConfig):
    """Runs in its own environment on the cluster (in the current one locally)."""
    return compute.run(
        context=context,
        payload_path=dg.file_relative_path(__file__, "../payloads/summarize.py"),
        config=config,
        extra_env={"SUMMARY_INPUT": "/tmp/models"},
    ).get_results()
