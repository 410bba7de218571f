"""Dagster definitions of the scaling example: one asset per workload.

Each asset runs one reconciliation step of its policy against the run's session (no Ray
payload is started here; add ``compute.run(...)`` calls between steps in a real workload)
and reports what it decided as metadata. Settings come from the environment like the other
examples (``SLURM_EDGE_NODE_*``, ``SLURM_PARTITION``, ``SLURM_GPU_PARTITION``).
"""

import os

import dagster as dg

from dagster_slurm import ComputeResource, SlurmWorkerAllocationConfig
from dagster_slurm_scaling.policies import batch_intent, model_intent, reconcile_step


def candidates() -> list[SlurmWorkerAllocationConfig]:
    """The candidate window: one GPU node for ``SCALING_WINDOW`` (20 minutes unless set);
    its walltime decides whether the model workload takes it."""
    partition = os.environ.get("SLURM_GPU_PARTITION", "gpu")
    window = os.environ.get("SCALING_WINDOW", "00:20:00")
    return [SlurmWorkerAllocationConfig(partition=partition, num_nodes=1, gpus_per_node=1,
                                        cpus_per_task=1, mem="500M", time_limit=window)]


def _metadata(step) -> dict[str, object]:
    return {"count": step.intent.count, "submitted": list(step.result.submitted),
            "live": list(step.result.live), "held_back": list(step.result.held_back),
            "start_in_seconds": [e.start_in_seconds for e in step.estimates]}


@dg.asset
def batch_tasks(context: dg.AssetExecutionContext, compute: ComputeResource) -> dg.Output[None]:
    """Eight independent tasks, four per allocation: grow while windows open."""
    session = compute.get_run_allocation_session(context, start=False)
    step = reconcile_step(session, lambda s, e: batch_intent(8, s, e), candidates())
    return dg.Output(None, metadata=_metadata(step))


@dg.asset
def model_requests(context: dg.AssetExecutionContext,
                   compute: ComputeResource) -> dg.Output[None]:
    """Requests behind a ten-minute model load: only long windows are worth it."""
    session = compute.get_run_allocation_session(context, start=False)
    step = reconcile_step(session, lambda s, e: model_intent(600.0, True, s, e), candidates())
    return dg.Output(None, metadata=_metadata(step))
