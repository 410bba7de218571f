"""The job figures under the metadata keys of the published dagster-slurm package.

Dashboards and sensors written for the published package read ``slurm_job_id``,
``node_hours``, ``cpu_efficiency_pct``, ``max_memory_mb`` and the ``slurm_gpu_*`` keys. The
library's own keys are ``dagster_slurm/*`` (:data:`~dagster_slurm.jobs.metrics.METADATA_KEYS`,
always present, null when unknown); the published keys are added besides them when
``ComputeResource(published_metadata_keys=True)`` is set or a call passes
``slurm_metrics=...``, with the published package's conventions: a figure that is not
known is left out (not null), percentages are percent (``cpu_efficiency_pct`` is
``dagster_slurm/cpu_efficiency`` × 100), and ``slurm_job_id`` is an integer when the id is
a plain number. They are attached in Slurm mode only, as the published package did.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import Enum

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.metrics import JobMetrics


class SlurmMetric(str, Enum):
    """A figure of the published package's metadata a call may select
    (``compute.run(..., slurm_metrics={SlurmMetric.NODE_HOURS, ...})``); the value is the
    metadata key."""

    ELAPSED_SECONDS = "elapsed_seconds"
    """Wall time of the job (or step) in seconds."""
    NODE_HOURS = "node_hours"
    """Elapsed time × allocated nodes, in hours."""
    CPU_EFFICIENCY = "cpu_efficiency_pct"
    """CPU time / (elapsed × allocated CPUs), in percent."""
    MAX_MEMORY = "max_memory_mb"
    """Largest ``MaxRSS`` in MiB."""
    STATE = "slurm_state"
    """The final state."""
    EXIT_CODE = "slurm_exit_code"
    """The payload's exit code."""
    GPU_ACCOUNTING_AVAILABLE = "slurm_gpu_accounting_available"
    """Whether accounting recorded GPU utilization or memory."""
    REQUESTED_GPUS = "slurm_requested_gpus"
    """GPUs requested (``ReqTRES``)."""
    ALLOCATED_GPUS = "slurm_allocated_gpus"
    """GPUs allocated (``AllocTRES``)."""
    GPU_UTILIZATION_AVG = "slurm_gpu_utilization_avg_pct"
    """Average GPU utilization in percent (``TRESUsageInAve``)."""
    GPU_UTILIZATION_MAX = "slurm_gpu_utilization_max_pct"
    """Highest GPU utilization in percent (``TRESUsageInMax``)."""
    GPU_MEMORY_MAX = "slurm_gpu_memory_max_mb"
    """Most GPU memory in use, in MiB (``TRESUsageInMax``)."""
    GPU_UTILIZATION_MAX_NODE = "slurm_gpu_utilization_max_node"
    """Node of the highest GPU utilization (``TRESUsageInMaxNode``)."""
    TRES_ACCOUNTING = "slurm_tres_accounting"
    """The published package's raw TRES rows; accepted in a selection, never attached
    (the library keeps the figures, not the rows)."""


ALWAYS_PUBLISHED: tuple[str, ...] = ("slurm_job_id", "slurm_step_id", "slurm_accounting_available")
"""Published keys attached whenever published keys are: the job id, the step id (run
scope), and whether the figures come from accounting."""

PUBLISHED_KEYS: Mapping[str, str | None] = {
    "slurm_job_id": "dagster_slurm/job_id",
    "slurm_step_id": "dagster_slurm/job_id",
    "slurm_accounting_available": "dagster_slurm/state_source",
    SlurmMetric.ELAPSED_SECONDS.value: "dagster_slurm/elapsed_seconds",
    SlurmMetric.NODE_HOURS.value: "dagster_slurm/node_hours",
    SlurmMetric.CPU_EFFICIENCY.value: "dagster_slurm/cpu_efficiency",
    SlurmMetric.MAX_MEMORY.value: "dagster_slurm/max_rss_mb",
    SlurmMetric.STATE.value: "dagster_slurm/state",
    SlurmMetric.EXIT_CODE.value: "dagster_slurm/exit_code",
    SlurmMetric.GPU_ACCOUNTING_AVAILABLE.value: None,
    SlurmMetric.REQUESTED_GPUS.value: "dagster_slurm/gpus_requested",
    SlurmMetric.ALLOCATED_GPUS.value: "dagster_slurm/gpus",
    SlurmMetric.GPU_UTILIZATION_AVG.value: "dagster_slurm/gpu_utilization_avg_pct",
    SlurmMetric.GPU_UTILIZATION_MAX.value: "dagster_slurm/gpu_utilization_max_pct",
    SlurmMetric.GPU_MEMORY_MAX.value: "dagster_slurm/gpu_memory_max_mb",
    SlurmMetric.GPU_UTILIZATION_MAX_NODE.value: "dagster_slurm/gpu_utilization_max_node",
    SlurmMetric.TRES_ACCOUNTING.value: None,
}
"""Every published key with the library key it is derived from (None: no single key)."""

ALL_METRICS: frozenset[SlurmMetric] = frozenset(SlurmMetric)
"""Every selectable figure: the selection of ``published_metadata_keys=True``."""


def metric_selection(selection: Collection[SlurmMetric | str] | None) -> frozenset[SlurmMetric]:
    """``slurm_metrics`` of a call as a set of :class:`SlurmMetric`; None selects every
    figure, an empty collection none (the keys of :data:`ALWAYS_PUBLISHED` stay). Raises
    :class:`ConfigurationError` (field ``slurm_metrics``) for a single string or an
    unknown name."""
    if selection is None:
        return ALL_METRICS
    if isinstance(selection, str | bytes) or not isinstance(selection, Collection):
        raise ConfigurationError(
            "slurm_metrics", selection,
            "must be a collection of SlurmMetric names (e.g. {'node_hours'}), not a single value",
        )
    chosen: set[SlurmMetric] = set()
    for item in selection:
        try:
            chosen.add(SlurmMetric(item))
        except ValueError:
            names = ", ".join(metric.value for metric in SlurmMetric)
            raise ConfigurationError(
                "slurm_metrics", sorted(map(str, selection)),
                f"unknown metric {item!r}; the metrics are {names}",
            ) from None
    return frozenset(chosen)


def _job_id(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _cpu_efficiency_pct(metrics: JobMetrics) -> float | None:
    """CPU time / (elapsed × CPUs) in percent. A job's ``cpu_efficiency`` is that fraction
    already; a step's is CPU time per elapsed second, so it is divided by the step's CPUs
    here (None when they are unknown)."""
    if metrics.cpu_efficiency is None:
        return None
    if metrics.step_id is None:
        return round(metrics.cpu_efficiency * 100, 2)
    if not metrics.cpus:
        return None
    return round(metrics.cpu_efficiency / metrics.cpus * 100, 2)


def published_metadata(metrics: JobMetrics, selection: Collection[SlurmMetric]) -> dict[str, object]:
    """``metrics`` under the published keys: :data:`ALWAYS_PUBLISHED` and the ``selection``,
    each only when known; nothing in local mode."""
    if metrics.mode != "slurm":
        return {}
    allocation = metrics.job_id.partition(".")[0] if metrics.step_id else metrics.job_id
    values: dict[str, object | None] = {
        "slurm_job_id": _job_id(allocation),
        "slurm_step_id": metrics.job_id if metrics.step_id else None,
        "slurm_accounting_available": metrics.from_accounting,
    }
    gpu = metrics.gpu
    figures: dict[SlurmMetric, object | None] = {
        SlurmMetric.ELAPSED_SECONDS: _rounded(metrics.elapsed_seconds, 2),
        SlurmMetric.NODE_HOURS: _rounded(metrics.node_hours, 4),
        SlurmMetric.CPU_EFFICIENCY: _cpu_efficiency_pct(metrics),
        SlurmMetric.MAX_MEMORY: None if metrics.max_rss_bytes is None
        else round(metrics.max_rss_bytes / 2**20, 2),
        SlurmMetric.STATE: metrics.state,
        SlurmMetric.EXIT_CODE: metrics.exit_code,
        SlurmMetric.GPU_ACCOUNTING_AVAILABLE: gpu.usage_recorded if metrics.from_accounting
        else None,
        SlurmMetric.REQUESTED_GPUS: gpu.requested,
        SlurmMetric.ALLOCATED_GPUS: gpu.allocated,
        SlurmMetric.GPU_UTILIZATION_AVG: _rounded(gpu.utilization_avg_pct, 2),
        SlurmMetric.GPU_UTILIZATION_MAX: _rounded(gpu.utilization_max_pct, 2),
        SlurmMetric.GPU_MEMORY_MAX: None if gpu.memory_max_bytes is None
        else round(gpu.memory_max_bytes / 2**20, 2),
        SlurmMetric.GPU_UTILIZATION_MAX_NODE: gpu.utilization_max_node,
    }
    chosen = {SlurmMetric(item) for item in selection}
    values.update({metric.value: value for metric, value in figures.items() if metric in chosen})
    return {key: value for key, value in values.items() if value is not None}


def invocation_metadata(metrics: JobMetrics,
                        published: Collection[SlurmMetric] | None = None) -> dict[str, object | None]:
    """The metadata of a finished call: ``metrics.as_metadata()`` (every ``dagster_slurm/*``
    key), plus :func:`published_metadata` for the ``published`` selection (None: no
    published key)."""
    values = metrics.as_metadata()
    if published is not None:
        values.update(published_metadata(metrics, published))
    return values
