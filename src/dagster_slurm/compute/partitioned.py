"""``compute.run`` for a step that runs for several partition keys at once.

A single-run backfill (``BackfillPolicy.single_run()``) or a run over a partition range
gives the step more than one key (:func:`~dagster_slurm.jobs.partitions.run_partition_keys`).
The payload then runs once per key: as one Slurm job array per run (asset scope,
:class:`~dagster_slurm.compute.slurm_array.SlurmArrayRunner`) or as a pool of local processes
(:class:`~dagster_slurm.compute.local_array.LocalArrayRunner`), each run of it with the Pipes
context of its own key. A step for one key runs as one job, as any other step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dagster import OpExecutionContext

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.array_tasks import ArrayInvocation
from dagster_slurm.jobs.pending import PendingPolicy
from dagster_slurm.jobs.runner import JobRequest
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.slurm.array_spec import validate_array_parallelism


class ComputeSettings(Protocol):
    """What a multi-partition step reads of its ``ComputeResource``."""

    mode: str
    allocation_scope: Any
    slurm: Any
    local_base_path: str | None
    run_status_interval: float
    heartbeat_timeout: float | None
    efficiency_warning_below: float | None

__all__ = ["check_array_arguments", "run_partitions"]


def check_array_arguments(array_parallelism: object, array_retries: object) -> tuple[int | None, int]:
    """The checked ``array_parallelism`` (None or >= 1) and ``array_retries`` (>= 0) of a
    ``compute.run`` call; :class:`ConfigurationError` naming the argument otherwise."""
    parallelism = validate_array_parallelism("array_parallelism", array_parallelism)
    if isinstance(array_retries, bool) or not isinstance(array_retries, int) or array_retries < 0:
        raise ConfigurationError("array_retries", array_retries,
                                 "must be a whole number of at least 0")
    return parallelism, array_retries


def check_partitioned_step(resource: ComputeSettings, request: JobRequest) -> None:
    """Refuse what a multi-partition step cannot do, before anything is started."""
    if not isinstance(request.launcher, BashLauncher):
        raise ConfigurationError(
            "launcher", type(request.launcher).__name__,
            "a step over several partitions runs its payload once per partition, as the "
            "tasks of a job array; use the BashLauncher for it (a RayLauncher or "
            "SparkLauncher cluster per partition is not supported), or run one partition per "
            "run (the default backfill policy)")
    if resource.mode == "slurm" and resource.allocation_scope.value == "run":
        raise ConfigurationError(
            "allocation_scope", "run",
            "a step over several partitions runs as a job array of its own; give the "
            "partitioned asset a ComputeResource with allocation_scope='asset', or run one "
            "partition per run (the default backfill policy)")


def run_partitions(resource: ComputeSettings, context: OpExecutionContext, request: JobRequest,
                   keys: Sequence[str], parallelism: int | None, retries: int, *,
                   pending: PendingPolicy,
                   prepare_env: Callable[[OpExecutionContext], str | None]) -> ArrayInvocation:
    """Run ``request`` once per key of ``keys`` in ``resource``'s mode; ``parallelism``
    None takes the queue's ``array_parallelism`` (slurm mode) or the CPU count (local).
    ``pending``: how a waiting array is judged; ``prepare_env``: the activation script of
    the step's environment on the cluster (None: none)."""
    check_partitioned_step(resource, request)
    if resource.mode == "local":
        from dagster_slurm.compute.local_array import LocalArrayRunner

        return LocalArrayRunner(resource.local_base_path,
                                run_status_interval=resource.run_status_interval
                                ).run(context, request, keys, parallelism, retries)
    from dagster_slurm.compute.slurm_array import SlurmArrayRunner

    assert resource.slurm is not None
    runner = SlurmArrayRunner(
        resource.slurm, pending, prepare_env,
        run_status_interval=resource.run_status_interval,
        heartbeat_timeout=resource.heartbeat_timeout,
        efficiency_warning_below=resource.efficiency_warning_below)
    limit = parallelism if parallelism is not None else resource.slurm.queue.array_parallelism
    return runner.run(context, request, keys, limit, retries)
