"""GPU figures in ``sacct``'s TRES columns (trackable resources).

``sacct`` prints TRES as comma-separated ``name=value`` pairs, for example
``billing=4,cpu=4,gres/gpu=2,mem=16G,node=1`` (``ReqTRES``, ``AllocTRES``) or
``cpu=00:01:10,gres/gpumem=3120M,gres/gpuutil=87,mem=2100M`` (``TRESUsageInAve``,
``TRESUsageInMax``); ``TRESUsageInMaxNode`` names the node where each maximum was seen
(``gres/gpuutil=gpu-03``). A site only gets GPU entries when its accounting tracks them:
``AccountingStorageTRES=gres/gpu`` for the counts, and GPU usage gathering (``AutoDetect=nvml``
or ``rsmi`` in ``gres.conf``) for ``gres/gpuutil`` and ``gres/gpumem``. An entry that is
not there is unknown (None), never 0: a missing ``gres/gpu`` may mean no GPU or a site that
does not track them. Text in, figures out; never raises.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dagster_slurm.slurm.units import parse_int, parse_size_bytes

GPU_COUNT = "gres/gpu"
"""TRES name of the GPU count (typed GPUs appear as ``gres/gpu:<type>`` as well)."""
GPU_UTILIZATION = "gres/gpuutil"
"""TRES name of GPU utilization, in percent of one GPU (NVML/RSMI device readings)."""
GPU_MEMORY = "gres/gpumem"
"""TRES name of GPU memory in use (a size; a bare number is bytes)."""


def parse_tres(text: object) -> dict[str, str]:
    """``{"cpu": "4", "gres/gpu": "2", ...}`` from a TRES column; ``{}`` for empty or
    unreadable text. Names are lower-cased; a pair without ``=`` is skipped."""
    if not isinstance(text, str):
        return {}
    pairs: dict[str, str] = {}
    for item in text.split(","):
        name, equals, value = item.partition("=")
        if equals and name.strip() and value.strip():
            pairs[name.strip().lower()] = value.strip()
    return pairs


def gpu_count(tres: Mapping[str, str]) -> int | None:
    """GPUs in a parsed ``ReqTRES``/``AllocTRES``: the ``gres/gpu`` entry, else the sum of
    the typed ``gres/gpu:<type>`` entries; None when there is neither (not recorded)."""
    if GPU_COUNT in tres:
        return parse_int(tres[GPU_COUNT])
    typed = [parse_int(value) for name, value in tres.items() if name.startswith(GPU_COUNT + ":")]
    known = [value for value in typed if value is not None]
    return sum(known) if known else None


def _percent(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class GpuFigures:
    """GPU figures of one ``sacct`` line, or of a job put together from its lines.

    Every field is None when the accounting did not record it (the site does not track
    GPUs, the job had none, or the column was not requested).
    """

    allocated: int | None = None
    """GPUs allocated (``AllocTRES`` ``gres/gpu``)."""
    requested: int | None = None
    """GPUs requested (``ReqTRES`` ``gres/gpu``)."""
    utilization_avg_pct: float | None = None
    """Average GPU utilization in percent (``TRESUsageInAve`` ``gres/gpuutil``)."""
    utilization_max_pct: float | None = None
    """Highest GPU utilization in percent (``TRESUsageInMax`` ``gres/gpuutil``)."""
    utilization_max_node: str | None = None
    """Node where the highest utilization was seen (``TRESUsageInMaxNode``)."""
    memory_max_bytes: int | None = None
    """Most GPU memory in use, in bytes (``TRESUsageInMax`` ``gres/gpumem``)."""

    @property
    def usage_recorded(self) -> bool:
        """Whether accounting recorded any GPU usage (utilization or memory)."""
        return any(value is not None for value in (
            self.utilization_avg_pct, self.utilization_max_pct, self.memory_max_bytes))


NO_GPU_FIGURES = GpuFigures()
"""Figures of a line without any GPU entry."""


def line_gpu_figures(row: Mapping[str, str]) -> GpuFigures:
    """The GPU figures of one ``sacct`` line, ``row`` keyed by lower-cased column name
    (``alloctres``, ``reqtres``, ``tresusageinave``, ``tresusageinmax``,
    ``tresusageinmaxnode``); absent columns give None."""
    average = parse_tres(row.get("tresusageinave"))
    maximum = parse_tres(row.get("tresusageinmax"))
    max_nodes = parse_tres(row.get("tresusageinmaxnode"))
    utilization_max = _percent(maximum.get(GPU_UTILIZATION))
    return GpuFigures(
        allocated=gpu_count(parse_tres(row.get("alloctres"))),
        requested=gpu_count(parse_tres(row.get("reqtres"))),
        utilization_avg_pct=_percent(average.get(GPU_UTILIZATION)),
        utilization_max_pct=utilization_max,
        utilization_max_node=max_nodes.get(GPU_UTILIZATION) if utilization_max is not None else None,
        memory_max_bytes=parse_size_bytes(maximum.get(GPU_MEMORY)),
    )


def job_gpu_figures(allocation: GpuFigures,
                    lines: Iterable[tuple[GpuFigures, float | None]]) -> GpuFigures:
    """A job's GPU figures from its allocation line's figures and every line of the job
    (the allocation line and the step lines, each with its elapsed seconds).

    Counts come from the allocation line. Usage is recorded on the step lines: the highest
    utilization and memory are the largest over every line (with the node of that
    utilization); the average is the mean of the lines' averages weighted by their elapsed
    time (a single line's average as it is; None when lines with an average have no
    elapsed time to weigh them by).
    """
    lines = list(lines)
    maxima = [(figures.utilization_max_pct, figures.utilization_max_node)
              for figures, _ in lines if figures.utilization_max_pct is not None]
    top = max(maxima, key=lambda item: item[0]) if maxima else (None, None)
    memory = [figures.memory_max_bytes for figures, _ in lines
              if figures.memory_max_bytes is not None]
    averages = [(figures.utilization_avg_pct, elapsed) for figures, elapsed in lines
                if figures.utilization_avg_pct is not None]
    return GpuFigures(
        allocated=allocation.allocated,
        requested=allocation.requested,
        utilization_avg_pct=_weighted_average(averages),
        utilization_max_pct=top[0],
        utilization_max_node=top[1],
        memory_max_bytes=max(memory) if memory else None,
    )


def _weighted_average(values: list[tuple[float, float | None]]) -> float | None:
    if len(values) == 1:
        return values[0][0]
    if not values or any(not weight for _, weight in values):
        return None
    total = sum(weight for _, weight in values if weight)
    return sum(value * weight for value, weight in values if weight) / total


def combine_components(parts: Iterable[GpuFigures]) -> GpuFigures:
    """The GPU figures of a heterogeneous job from its components' figures: counts added
    up over the components that recorded one (None when none did), the highest
    utilization and memory over all of them; the average is component 0's (the first)."""
    figures = list(parts)
    if not figures:
        return NO_GPU_FIGURES
    allocated = [part.allocated for part in figures if part.allocated is not None]
    requested = [part.requested for part in figures if part.requested is not None]
    maxima = [(part.utilization_max_pct, part.utilization_max_node) for part in figures
              if part.utilization_max_pct is not None]
    top = max(maxima, key=lambda item: item[0]) if maxima else (None, None)
    memory = [part.memory_max_bytes for part in figures if part.memory_max_bytes is not None]
    return GpuFigures(
        allocated=sum(allocated) if allocated else None,
        requested=sum(requested) if requested else None,
        utilization_avg_pct=figures[0].utilization_avg_pct,
        utilization_max_pct=top[0],
        utilization_max_node=top[1],
        memory_max_bytes=max(memory) if memory else None,
    )
