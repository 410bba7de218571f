"""What a job or a task cost and how well it used what it asked for (pure).

Figures, all numbers so Dagster plots them over time (None where not known):

* ``dagster_slurm/cpu_hours``: CPUs allocated x elapsed, in hours (what the site charges);
* ``dagster_slurm/gpu_hours``: GPUs allocated x elapsed, in hours (None where accounting
  shows no GPUs: a job without GPUs and a site that does not record them look the same);
* ``dagster_slurm/memory_efficiency``: peak RSS / memory requested (per node);
* ``dagster_slurm/cpu_efficiency``: CPU time / (elapsed x CPUs allocated), as reported;
* ``dagster_slurm/queue_wait_seconds``: from submission to start: Slurm's own figure
  (``Planned``, Slurm 23.02 and later) where accounting has it, else the wait the library
  observed itself (to within a poll).

:func:`run_summary` adds them up over the partitions of a run (sums of hours, means of
efficiencies), and :func:`efficiency_warning` says which request to lower when the run's
mean efficiency is under a threshold.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DEFAULT_EFFICIENCY_WARNING", "cost_figures", "efficiency_warning", "requested_memory_bytes",
    "run_summary",
]

#: Mean efficiency under which a run is warned about (``efficiency_warning_below``).
DEFAULT_EFFICIENCY_WARNING = 0.5


def cost_figures(*, elapsed_seconds: float | None, cpus: int | None, gpus: int | None,
                 max_rss_bytes: int | None, requested_mem_bytes: int | None,
                 cpu_efficiency: float | None,
                 queue_wait_seconds: float | None) -> dict[str, float | None]:
    """The figures of the module docstring for one job or task."""
    hours = None if elapsed_seconds is None else elapsed_seconds / 3600
    return {
        "dagster_slurm/cpu_hours": _round(None if hours is None or cpus is None else hours * cpus),
        "dagster_slurm/gpu_hours": _round(None if hours is None or gpus is None else hours * gpus),
        "dagster_slurm/memory_efficiency": _round(
            None if max_rss_bytes is None or not requested_mem_bytes
            else max_rss_bytes / requested_mem_bytes),
        "dagster_slurm/cpu_efficiency": _round(cpu_efficiency),
        "dagster_slurm/queue_wait_seconds": _round(queue_wait_seconds, 3),
    }


def run_summary(figures: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """Totals over the tasks of a run: hours summed, efficiencies and queue waits averaged
    over the tasks that have them (``run_`` keys; None where no task has the figure)."""
    rows = list(figures)

    def values(key: str) -> list[float]:
        return [float(row[key]) for row in rows if isinstance(row.get(key), (int, float))]

    def total(key: str) -> float | None:
        found = values(key)
        return _round(sum(found)) if found else None

    def mean(key: str) -> float | None:
        found = values(key)
        return _round(statistics.fmean(found)) if found else None

    return {
        "dagster_slurm/run_cpu_hours": total("dagster_slurm/cpu_hours"),
        "dagster_slurm/run_gpu_hours": total("dagster_slurm/gpu_hours"),
        "dagster_slurm/run_mean_cpu_efficiency": mean("dagster_slurm/cpu_efficiency"),
        "dagster_slurm/run_mean_memory_efficiency": mean("dagster_slurm/memory_efficiency"),
        "dagster_slurm/run_mean_queue_wait_seconds": mean("dagster_slurm/queue_wait_seconds"),
    }


def efficiency_warning(summary: Mapping[str, Any], threshold: float | None, *,
                       cpus: int | None, mem: str | None) -> str | None:
    """A line telling which request to lower when the run's mean CPU or memory efficiency
    is under ``threshold`` (None: never); None when both are at or above it, or unknown,
    and for CPUs when each task has one CPU (nothing to lower)."""
    if threshold is None:
        return None
    advice = []
    cpu = summary.get("dagster_slurm/run_mean_cpu_efficiency")
    memory = summary.get("dagster_slurm/run_mean_memory_efficiency")
    # one CPU per task cannot be lowered: no advice about CPUs then
    if isinstance(cpu, (int, float)) and cpu < threshold and (cpus is None or cpus > 1):
        advice.append(f"CPU efficiency {cpu:.0%} of {cpus or '?'} CPU(s) per task: ask for fewer "
                      "CPUs (cpus / cpus_per_task), or make the payload use them")
    if isinstance(memory, (int, float)) and memory < threshold:
        advice.append(f"memory efficiency {memory:.0%} of {mem or 'the requested memory'}: "
                      "ask for less memory (mem)")
    if not advice:
        return None
    return (f"The run used less than {threshold:.0%} of what it asked for: " + "; ".join(advice)
            + " (efficiency_warning_below sets this threshold; None turns it off)")


def requested_memory_bytes(spec: Any) -> int | None:
    """Memory one task (or job) asked for per node, in bytes, from its sbatch spec (``mem``,
    or ``mem_per_cpu`` x ``cpus_per_task``); None when it asked for none (the partition's
    default, unknown here)."""
    from dagster_slurm.slurm.units import parse_size_bytes

    if getattr(spec, "mem", None):
        return parse_size_bytes(spec.mem, default_unit="M")
    if getattr(spec, "mem_per_cpu", None):
        per_cpu = parse_size_bytes(spec.mem_per_cpu, default_unit="M")
        return None if per_cpu is None else per_cpu * (spec.cpus_per_task or 1)
    return None


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)
