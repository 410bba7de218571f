"""dagster-slurm: run Dagster assets on Slurm clusters over SSH with Dagster Pipes.

Public names are imported lazily, so that importing the package (the pytest plugin does it
in every test run) does not import Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "SSHConnectionResource": "dagster_slurm.resources.ssh",
    "SlurmResource": "dagster_slurm.resources.slurm",
    "SlurmQueueConfig": "dagster_slurm.slurm.queue",
    "JobState": "dagster_slurm.slurm.states",
    "SlurmScheduler": "dagster_slurm.scheduler.client",
    "JobWatcher": "dagster_slurm.scheduler.watcher",
    "DagsterSlurmError": "dagster_slurm.errors",
    "ConfigurationError": "dagster_slurm.errors",
    "TransportError": "dagster_slurm.errors",
    "HostKeyError": "dagster_slurm.errors",
    "CommandFailed": "dagster_slurm.errors",
    "CommandTimeout": "dagster_slurm.errors",
    "LockTimeout": "dagster_slurm.errors",
    "SchedulerError": "dagster_slurm.errors",
    "ComputeResource": "dagster_slurm.compute.resource",
    "SlurmAllocationScope": "dagster_slurm.compute.resource",
    "SlurmRunConfig": "dagster_slurm.compute.run_config",
    "ComputePipesClient": "dagster_slurm.compute.pipes_client",
    "LocalPipesClient": "dagster_slurm.compute.published_clients",
    "SlurmPipesClient": "dagster_slurm.compute.published_clients",
    "SlurmMetric": "dagster_slurm.jobs.published_metadata",
    "HetJobComponent": "dagster_slurm.compute.hetjob",
    "BashLauncher": "dagster_slurm.launchers.bash",
    "ComputeLauncher": "dagster_slurm.launchers.base",
    "SlurmJobError": "dagster_slurm.jobs.errors",
    "DagsterRunEnded": "dagster_slurm.jobs.follow",
    "SlurmJobNonZeroExit": "dagster_slurm.jobs.errors",
    "SlurmJobTimeout": "dagster_slurm.jobs.errors",
    "SlurmJobOutOfMemory": "dagster_slurm.jobs.errors",
    "SlurmNodeFailure": "dagster_slurm.jobs.errors",
    "SlurmJobCancelled": "dagster_slurm.jobs.errors",
    "SlurmJobRequeued": "dagster_slurm.jobs.errors",
    "SlurmJobPreempted": "dagster_slurm.jobs.errors",
    "SlurmJobUnschedulable": "dagster_slurm.jobs.errors",
    "SlurmJobLost": "dagster_slurm.jobs.errors",
    "SlurmSubmissionError": "dagster_slurm.jobs.errors",
    "RayLauncher": "dagster_slurm.launchers.ray",
    "RayPortConfig": "dagster_slurm.launchers.ray_ports",
    "SparkLauncher": "dagster_slurm.launchers.spark",
    "SlurmRunAllocationConfig": "dagster_slurm.session.core.config",
    "SlurmWorkerAllocationConfig": "dagster_slurm.session.core.worker_config",
    "WorkerAllocation": "dagster_slurm.session.workers.submit",
    "WorkerIntent": "dagster_slurm.session.scaling.intents",
    "ReconcileResult": "dagster_slurm.session.scaling.intents",
    "SessionSnapshot": "dagster_slurm.session.scaling.snapshot",
    "AllocationSnapshot": "dagster_slurm.session.scaling.snapshot",
    "SbatchTestOnlyEstimator": "dagster_slurm.session.scaling.estimates",
    "WorkerStartEstimate": "dagster_slurm.session.scaling.estimates",
    "WorkerStartEstimator": "dagster_slurm.session.scaling.estimates",
    "run_with_ray_reserve_topup": "dagster_slurm.ray",
    "wait_for_stable_ray_resources": "dagster_slurm.ray",
    "SlurmSessionResource": "dagster_slurm.session.frontend.resource",
    "RunSession": "dagster_slurm.session.session",
    "SlurmAllocation": "dagster_slurm.session.core.allocation",
    "SlurmStepExecutionResult": "dagster_slurm.session.core.errors",
    "SlurmAllocationEnded": "dagster_slurm.session.core.errors",
    "SlurmAllocationNodeFailure": "dagster_slurm.session.core.errors",
    "SlurmStepDrained": "dagster_slurm.session.core.errors",
    "SlurmStepFailed": "dagster_slurm.session.core.errors",
    "SessionError": "dagster_slurm.session.core.errors",
    "reconcile_orphaned_slurm_runs": "dagster_slurm.session.orphans.search",
    "build_slurm_orphan_reconcile_sensor": "dagster_slurm.session.orphans.search",
}

__all__ = [
    "AllocationSnapshot",
    "BashLauncher",
    "CommandFailed",
    "CommandTimeout",
    "ComputeLauncher",
    "ComputePipesClient",
    "ComputeResource",
    "ConfigurationError",
    "DagsterRunEnded",
    "DagsterSlurmError",
    "HetJobComponent",
    "HostKeyError",
    "JobState",
    "JobWatcher",
    "LocalPipesClient",
    "LockTimeout",
    "RayLauncher",
    "RayPortConfig",
    "ReconcileResult",
    "RunSession",
    "SSHConnectionResource",
    "SbatchTestOnlyEstimator",
    "SchedulerError",
    "SessionError",
    "SessionSnapshot",
    "SlurmAllocation",
    "SlurmAllocationEnded",
    "SlurmAllocationNodeFailure",
    "SlurmAllocationScope",
    "SlurmJobCancelled",
    "SlurmJobError",
    "SlurmJobLost",
    "SlurmJobNonZeroExit",
    "SlurmJobOutOfMemory",
    "SlurmJobPreempted",
    "SlurmJobRequeued",
    "SlurmJobTimeout",
    "SlurmJobUnschedulable",
    "SlurmMetric",
    "SlurmNodeFailure",
    "SlurmPipesClient",
    "SlurmQueueConfig",
    "SlurmResource",
    "SlurmRunAllocationConfig",
    "SlurmRunConfig",
    "SlurmScheduler",
    "SlurmSessionResource",
    "SlurmStepDrained",
    "SlurmStepExecutionResult",
    "SlurmStepFailed",
    "SlurmSubmissionError",
    "SlurmWorkerAllocationConfig",
    "SparkLauncher",
    "TransportError",
    "WorkerAllocation",
    "WorkerIntent",
    "WorkerStartEstimate",
    "WorkerStartEstimator",
    "build_slurm_orphan_reconcile_sensor",
    "reconcile_orphaned_slurm_runs",
    "run_with_ray_reserve_topup",
    "wait_for_stable_ray_resources",
]

if TYPE_CHECKING:
    from dagster_slurm.compute.hetjob import HetJobComponent
    from dagster_slurm.compute.pipes_client import ComputePipesClient
    from dagster_slurm.compute.published_clients import LocalPipesClient, SlurmPipesClient
    from dagster_slurm.compute.resource import (
        ComputeResource,
        SlurmAllocationScope,
    )
    from dagster_slurm.compute.run_config import SlurmRunConfig
    from dagster_slurm.errors import (
        CommandFailed,
        CommandTimeout,
        ConfigurationError,
        DagsterSlurmError,
        HostKeyError,
        LockTimeout,
        SchedulerError,
        TransportError,
    )
    from dagster_slurm.jobs.errors import (
        SlurmJobCancelled,
        SlurmJobError,
        SlurmJobLost,
        SlurmJobNonZeroExit,
        SlurmJobOutOfMemory,
        SlurmJobPreempted,
        SlurmJobRequeued,
        SlurmJobTimeout,
        SlurmJobUnschedulable,
        SlurmNodeFailure,
        SlurmSubmissionError,
    )
    from dagster_slurm.jobs.follow import DagsterRunEnded
    from dagster_slurm.jobs.published_metadata import SlurmMetric
    from dagster_slurm.launchers.base import ComputeLauncher
    from dagster_slurm.launchers.bash import BashLauncher
    from dagster_slurm.launchers.ray import RayLauncher
    from dagster_slurm.launchers.ray_ports import RayPortConfig
    from dagster_slurm.launchers.spark import SparkLauncher
    from dagster_slurm.resources.slurm import SlurmResource
    from dagster_slurm.resources.ssh import SSHConnectionResource
    from dagster_slurm.scheduler.client import SlurmScheduler
    from dagster_slurm.scheduler.watcher import JobWatcher
    from dagster_slurm.session.core.allocation import SlurmAllocation
    from dagster_slurm.session.core.config import SlurmRunAllocationConfig
    from dagster_slurm.session.core.errors import (
        SlurmAllocationEnded,
        SlurmAllocationNodeFailure,
        SlurmStepDrained,
        SlurmStepExecutionResult,
        SlurmStepFailed,
    )
    from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
    from dagster_slurm.session.frontend.resource import SlurmSessionResource
    from dagster_slurm.session.orphans.search import (
        build_slurm_orphan_reconcile_sensor,
        reconcile_orphaned_slurm_runs,
    )
    from dagster_slurm.session.session import RunSession
    from dagster_slurm.session.workers.submit import WorkerAllocation
    from dagster_slurm.slurm.queue import SlurmQueueConfig
    from dagster_slurm.slurm.states import JobState


#: Names the published dagster-slurm package exported that have no counterpart here, with
#: what to use instead; importing one raises ImportError with that text.
_NOT_PROVIDED: dict[str, str] = {
    name: (
        f"{name} is a name of the published dagster-slurm package: there are no metric "
        "callbacks (compute.run(metrics_collector=...)) here. The job's accounting figures "
        "are attached as metadata (dagster_slurm/*, and the published names with "
        "ComputeResource(published_metadata_keys=True) or compute.run(slurm_metrics=...)); "
        "report further figures from the payload through Dagster Pipes"
    )
    for name in ("SlurmMetricsContext", "SlurmMetricsCallback")
}


def __getattr__(name: str) -> Any:
    if name in _NOT_PROVIDED:
        raise ImportError(_NOT_PROVIDED[name], name="dagster_slurm")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_slurm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
