"""Which partitions a step runs for, and the Pipes context of each of them.

A step of a partitioned asset runs for one partition key (a run per partition, as Dagster
launches a backfill by default) or for several at once (a single-run backfill,
``BackfillPolicy.single_run()``, or a run over a partition range). :func:`run_partition_keys`
tells the second case apart: ``compute.run`` then runs the payload once per key, as a job
array in slurm mode and as a pool of processes in local mode. Each run of the payload gets
the step's Pipes context with the partition fields of its own key
(:func:`partition_context_data`): ``context.partition_key`` in the payload is its key, as
in a run for that partition alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import OpExecutionContext, TimeWindowPartitionsDefinition
from dagster._core.pipes.context import build_external_execution_context_data
from dagster_pipes import PipesContextData

__all__ = ["partition_context_data", "run_partition_keys", "step_context_data"]


def run_partition_keys(context: OpExecutionContext) -> list[str] | None:
    """The partition keys of a step that runs for a range of partitions (a single-run
    backfill, a run over a range), in Dagster's order, also when the range holds one key
    (a backfill of one failed partition: Dagster gives such a run no partition key, so it
    runs as an array of one task, whose payload gets its key); None for a step of an
    unpartitioned asset or op, and for a run of one partition (``dagster/partition``), which
    stays one job as any other step."""
    if context.has_partition_key or not context.has_partition_key_range:
        return None
    try:
        keys = [str(key) for key in context.partition_keys]
    except Exception:  # noqa: BLE001 - a context that cannot list its keys runs as one job
        return None
    return keys or None


def step_context_data(context: OpExecutionContext, extras: Mapping[str, Any] | None) -> PipesContextData:
    """The Pipes context Dagster would give the step (its assets, run, extras ...), the
    partition fields still those of the whole range (see :func:`partition_context_data`)."""
    return build_external_execution_context_data(context, dict(extras or {}))


def partition_context_data(step_data: PipesContextData, context: OpExecutionContext,
                           key: str) -> PipesContextData:
    """``step_data`` for the payload's run of partition ``key``: ``partition_key`` is
    ``key``, ``partition_key_range`` is ``key`` to ``key`` and, for a time-window
    partitioned asset, ``partition_time_window`` is the key's window (else None)."""
    data: dict[str, Any] = dict(step_data)
    data["partition_key"] = key
    data["partition_key_range"] = {"start": key, "end": key}
    data["partition_time_window"] = _time_window(context, key)
    return data  # type: ignore[return-value]


def _time_window(context: OpExecutionContext, key: str) -> dict[str, str] | None:
    partitions_def = _partitions_def(context)
    if not isinstance(partitions_def, TimeWindowPartitionsDefinition):
        return None
    window = partitions_def.time_window_for_partition_key(key)
    return {"start": window.start.isoformat(), "end": window.end.isoformat()}


def _partitions_def(context: OpExecutionContext) -> object:
    try:
        return context.get_step_execution_context().run_partitions_def
    except Exception:  # noqa: BLE001 - no partitions definition: no time window
        return None
