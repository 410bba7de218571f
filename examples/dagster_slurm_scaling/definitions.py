"""Dagster definitions of the scaling example: one asset per workload and candidate window.

Each asset runs one reconciliation step of its policy against the run's session (no Ray
payload is started here; a real workload runs ``compute.run(...)`` between steps) and
reports what it decided as metadata. :func:`window_assets` builds the pair for one window
(a GPU node for ``time_limit``); :func:`definitions` the project for one window (20
minutes by default: the batch workload takes it, the model workload declines it). Settings come from the environment like the
other examples (``SLURM_EDGE_NODE_*``, ``SLURM_PARTITION``, ``SLURM_GPU_PARTITION``).
"""

import os
from collections.abc import Sequence

import dagster as dg

from dagster_slurm import ComputeResource, SlurmWorkerAllocationConfig
from dagster_slurm_scaling.policies import Step, batch_intent, model_intent, reconcile_step

#: Tasks the batch workload still has, four per allocation.
BATCH_TASKS = 8
#: Seconds the model workload needs to load its model on a new allocation.
MODEL_STARTUP = 600.0


def candidate(time_limit: str) -> SlurmWorkerAllocationConfig:
    """One GPU node of the GPU partition for ``time_limit``."""
    return SlurmWorkerAllocationConfig(
        partition=os.environ.get("SLURM_GPU_PARTITION", "gpu"), num_nodes=1, gpus_per_node=1,
        cpus_per_task=1, mem="500M", time_limit=time_limit)


def _metadata(step: Step) -> dict[str, object]:
    return {"count": step.intent.count, "submitted": list(step.result.submitted),
            "live": list(step.result.live), "held_back": list(step.result.held_back),
            "start_in_seconds": [e.start_in_seconds for e in step.estimates],
            "time_limit_seconds": [e.time_limit_seconds for e in step.estimates],
            "errors": [e.error for e in step.estimates]}


def window_assets(time_limit: str, suffix: str = "",
                  deps: Sequence[str] = ()) -> list[dg.AssetsDefinition]:
    """``batch_tasks<suffix>`` and ``model_requests<suffix>`` (after it, and after
    ``deps``), each one reconciliation step for the window ``time_limit``."""

    @dg.asset(name=f"batch_tasks{suffix}", deps=list(deps))
    def batch(context: dg.AssetExecutionContext, compute: ComputeResource) -> dg.Output[None]:
        session = compute.get_run_allocation_session(context, start=False)
        step = reconcile_step(session, lambda s, e: batch_intent(BATCH_TASKS, s, e),
                              [candidate(time_limit)])
        return dg.Output(None, metadata=_metadata(step))

    @dg.asset(name=f"model_requests{suffix}", deps=[batch])
    def model(context: dg.AssetExecutionContext, compute: ComputeResource) -> dg.Output[None]:
        session = compute.get_run_allocation_session(context, start=False)
        step = reconcile_step(session, lambda s, e: model_intent(MODEL_STARTUP, True, s, e),
                              [candidate(time_limit)])
        return dg.Output(None, metadata=_metadata(step))

    return [batch, model]


def definitions(time_limit: str = "00:20:00") -> dg.Definitions:
    """The pair of assets for one window, with a run-scoped Ray compute resource on the
    cluster the ``SLURM_EDGE_NODE_*`` variables name (the hooks need a cluster: they observe
    and submit Slurm jobs)."""
    from dagster_slurm import RayLauncher, SlurmResource

    compute = ComputeResource(mode="slurm", slurm=SlurmResource.from_env(),
                              default_launcher=RayLauncher(), allocation_scope="run")
    return dg.Definitions(assets=window_assets(time_limit), resources={"compute": compute})
