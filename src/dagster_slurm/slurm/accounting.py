"""Parser for ``sacct`` output: one record per job, aggregated over its step lines.

``sacct`` prints an allocation line (``4``) and one line per step (``4.batch``,
``4.extern``, ``4.0``). The job's state, exit code, elapsed time and node list come from the
allocation line; ``MaxRSS`` is only reported on step lines, so the record keeps the maximum
over all of them. GPU counts come from the allocation line's TRES columns, GPU usage from the
step lines' (:mod:`dagster_slurm.slurm.tres`). Text in, records out; never raises; unreadable
fields are None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from dagster_slurm.slurm.commands import SACCT_BASE_FIELDS, SACCT_FIELDS, SACCT_PLANNED_FIELDS
from dagster_slurm.slurm.hostlist import expand_hostlist
from dagster_slurm.slurm.states import JobState, cancelled_by
from dagster_slurm.slurm.tres import NO_GPU_FIGURES, GpuFigures, job_gpu_figures, line_gpu_figures
from dagster_slurm.slurm.units import optional_text, parse_int, parse_size_bytes, parse_timestamp
from dagster_slurm.slurm.walltime import parse_duration


@dataclass(frozen=True)
class SacctStep:
    """One step line of a job (``batch``, ``extern``, ``0``, ...)."""

    step_id: str
    """The part of the JobID after the dot."""
    state: JobState
    """Step state (``UNKNOWN`` when unreadable)."""
    elapsed_seconds: float | None
    """Wall time of the step."""
    max_rss_bytes: int | None
    """Peak resident memory of the step's largest task; None when not sampled."""
    total_cpu_seconds: float | None
    """User + system CPU time of the step."""
    num_nodes: int | None = None
    """Nodes the step ran on (``NNodes`` of its line); None when not given."""
    alloc_cpus: int | None = None
    """CPUs of the step (``AllocCPUS`` of its line); None when not given."""
    gpu: GpuFigures = NO_GPU_FIGURES
    """GPU figures of the step's line (None fields where not recorded)."""

    @property
    def node_hours(self) -> float | None:
        """``elapsed × nodes`` of the step in hours; None when either is unknown."""
        return _node_hours(self.elapsed_seconds, self.num_nodes)


@dataclass(frozen=True)
class SacctRecord:
    """Accounting data of one job. Optional fields are None when ``sacct`` gave nothing
    readable (for example while the job is pending, or when the column was not requested)."""

    job_id: str
    """Job id without step suffix (``123``, ``123_4``)."""
    name: str | None
    """Job name."""
    state: JobState
    """State of the allocation line; ``UNKNOWN`` when there was none or it was unreadable."""
    raw_state: str | None
    """State text as printed, e.g. ``CANCELLED by 0``."""
    cancelled_by: int | None
    """Uid that cancelled the job (from ``CANCELLED by <uid>``)."""
    exit_code: int | None
    """Exit code of the batch script (before the colon of ``ExitCode``)."""
    exit_signal: int | None
    """Signal that ended the batch script (after the colon; 0 = none)."""
    elapsed_seconds: float | None
    """Wall time of the allocation (``ElapsedRaw``, else ``Elapsed``)."""
    max_rss_bytes: int | None
    """Largest ``MaxRSS`` over all lines of the job, in bytes."""
    total_cpu_seconds: float | None
    """CPU time of the job (allocation line; the sum of its steps when that is empty)."""
    num_nodes: int | None
    """Allocated node count."""
    node_list: str | None
    """Allocated nodes, compact form; None while none are assigned."""
    nodes: tuple[str, ...] | None
    """``node_list`` expanded; ``()`` while none are assigned."""
    alloc_cpus: int | None
    """Allocated CPUs."""
    start_time: datetime | None
    """Start (cluster local time), None while unknown."""
    end_time: datetime | None
    """End (cluster local time), None while running."""
    steps: tuple[SacctStep, ...] = ()
    """Step lines in output order."""
    gpu: GpuFigures = NO_GPU_FIGURES
    """GPU figures of the job: counts from the allocation line, usage over its lines (see
    :func:`~dagster_slurm.slurm.tres.job_gpu_figures`); None fields where not recorded."""
    planned_seconds: float | None = None
    """How long the job waited while eligible to start (``Planned``, requested on Slurm
    23.02 and later); None where not requested or not given."""

    @property
    def node_hours(self) -> float | None:
        """``elapsed × allocated nodes`` in hours (what the allocation occupied); None when
        either is unknown."""
        return _node_hours(self.elapsed_seconds, self.num_nodes)

    @property
    def cpu_efficiency(self) -> float | None:
        """``total_cpu / (elapsed × alloc_cpus)``; None when a term is unknown or zero."""
        if self.total_cpu_seconds is None or self.elapsed_seconds is None:
            return None
        if self.alloc_cpus is None:
            return None
        capacity = self.elapsed_seconds * self.alloc_cpus
        if capacity <= 0 or math.isinf(capacity):
            return None
        return self.total_cpu_seconds / capacity


def _node_hours(elapsed: float | None, nodes: int | None) -> float | None:
    if elapsed is None or nodes is None or math.isinf(elapsed):
        return None
    return elapsed * nodes / 3600.0


_NO_NODES = frozenset({"none assigned", "(null)", "none"})


def parse_sacct(text: object, fields: Sequence[str] = SACCT_FIELDS) -> dict[str, SacctRecord]:
    """Records keyed by job id, from ``sacct --parsable2`` output.

    Columns are taken from ``fields`` (default: the columns
    :func:`~dagster_slurm.slurm.commands.sacct_argv` requests), or from a header line when
    the output starts with one (``JobID|...``). With the default columns, a line of only
    :data:`~dagster_slurm.slurm.commands.SACCT_BASE_FIELDS` (without the TRES columns, as
    earlier releases asked for) is read with those; its GPU figures are None. So is a line
    with :data:`~dagster_slurm.slurm.commands.SACCT_PLANNED_FIELDS` appended (what
    :func:`~dagster_slurm.slurm.commands.sacct_fields` requests on newer Slurm releases). Other
    lines whose column count does not match, and lines without a ``|`` (such as
    ``Slurm accounting storage is disabled``), are skipped.
    """
    if not isinstance(text, str):
        return {}
    lines = [line for line in text.splitlines() if "|" in line]
    columns = [name.strip().lower() for name in fields]
    if lines and lines[0].split("|", 1)[0].strip().lower() == "jobid":
        columns = [name.strip().lower() for name in lines[0].split("|")]
        lines = lines[1:]
    widths = {len(columns)}
    base = [name.lower() for name in SACCT_BASE_FIELDS]
    if columns[: len(base)] == base:
        widths.add(len(base))
    if columns == [name.lower() for name in SACCT_FIELDS]:
        columns += [name.lower() for name in SACCT_PLANNED_FIELDS]
        widths.add(len(columns))
    allocations: dict[str, Mapping[str, str]] = {}
    steps: dict[str, list[Mapping[str, str]]] = {}
    for line in lines:
        cells = line.split("|")
        if len(cells) not in widths:
            continue
        row = dict(zip(columns[: len(cells)], cells, strict=True))
        full_id = (row.get("jobid") or "").strip()
        if not full_id or any(char.isspace() for char in full_id):
            continue
        job_id, dot, _ = full_id.partition(".")
        if dot:
            steps.setdefault(job_id, []).append(row)
        else:
            allocations[job_id] = row
            steps.setdefault(job_id, [])
    return {
        job_id: _record(job_id, allocations.get(job_id, {}), rows) for job_id, rows in steps.items()
    }


def _record(job_id: str, row: Mapping[str, str], step_rows: list[Mapping[str, str]]) -> SacctRecord:
    steps = tuple(_step(step_row) for step_row in step_rows)
    exit_code, exit_signal = _exit_code(row.get("exitcode"))
    node_list = optional_text(row.get("nodelist"), none_values=_NO_NODES)
    rss_values = [parse_size_bytes(row.get("maxrss"))] + [step.max_rss_bytes for step in steps]
    known_rss = [value for value in rss_values if value is not None]
    total_cpu = parse_duration(row.get("totalcpu"))
    step_cpu = [step.total_cpu_seconds for step in steps]
    if total_cpu is None and step_cpu and all(value is not None for value in step_cpu):
        total_cpu = sum(value for value in step_cpu if value is not None)
    raw_state = optional_text(row.get("state"))
    own_gpu = line_gpu_figures(row)
    return SacctRecord(
        job_id=job_id,
        name=optional_text(row.get("jobname")),
        state=JobState.parse(raw_state),
        raw_state=raw_state,
        cancelled_by=cancelled_by(raw_state),
        exit_code=exit_code,
        exit_signal=exit_signal,
        elapsed_seconds=_elapsed(row),
        max_rss_bytes=max(known_rss) if known_rss else None,
        total_cpu_seconds=total_cpu,
        num_nodes=parse_int(row.get("nnodes")),
        node_list=node_list,
        nodes=expand_hostlist(node_list or ""),
        alloc_cpus=parse_int(row.get("alloccpus")),
        start_time=parse_timestamp(row.get("start")),
        end_time=parse_timestamp(row.get("end")),
        steps=steps,
        planned_seconds=parse_duration(row.get("planned")),
        gpu=job_gpu_figures(own_gpu, [
            (own_gpu, _elapsed(row)), *((step.gpu, step.elapsed_seconds) for step in steps),
        ]),
    )


def _step(row: Mapping[str, str]) -> SacctStep:
    return SacctStep(
        step_id=(row.get("jobid") or "").strip().partition(".")[2],
        state=JobState.parse(row.get("state")),
        elapsed_seconds=_elapsed(row),
        max_rss_bytes=parse_size_bytes(row.get("maxrss")),
        total_cpu_seconds=parse_duration(row.get("totalcpu")),
        num_nodes=parse_int(row.get("nnodes")),
        alloc_cpus=parse_int(row.get("alloccpus")),
        gpu=line_gpu_figures(row),
    )


def _elapsed(row: Mapping[str, str]) -> float | None:
    raw = parse_int(row.get("elapsedraw"))
    return float(raw) if raw is not None else parse_duration(row.get("elapsed"))


def _exit_code(text: object) -> tuple[int | None, int | None]:
    """``"0:15"`` → ``(0, 15)``; unreadable parts are None."""
    if not isinstance(text, str) or ":" not in text:
        return parse_int(text), None
    code, _, signal = text.strip().partition(":")
    return parse_int(code), parse_int(signal)
