"""Job figures that become materialization metadata, with the same keys in both modes.

Slurm mode fills them from ``sacct``; local mode from the payload process's resource usage.
Every key is always present, so an asset's metadata has the same keys in both modes; a figure
that could not be observed is a null value, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_slurm.slurm.accounting import SacctRecord, SacctStep

#: Metadata keys a compute invocation attaches (when the value is known).
METADATA_KEYS = (
    "dagster_slurm/mode",
    "dagster_slurm/job_id",
    "dagster_slurm/state",
    "dagster_slurm/exit_code",
    "dagster_slurm/elapsed_seconds",
    "dagster_slurm/cpu_efficiency",
    "dagster_slurm/max_rss_mb",
    "dagster_slurm/nodes",
)


@dataclass(frozen=True)
class JobMetrics:
    """Figures of one finished job; None means not observed."""

    mode: str
    job_id: str
    state: str | None
    exit_code: int | None
    elapsed_seconds: float | None
    cpu_efficiency: float | None
    max_rss_bytes: int | None
    nodes: str | None

    def as_metadata(self) -> dict[str, object | None]:
        values: dict[str, object | None] = {
            "dagster_slurm/mode": self.mode,
            "dagster_slurm/job_id": self.job_id,
            "dagster_slurm/state": self.state,
            "dagster_slurm/exit_code": self.exit_code,
            "dagster_slurm/elapsed_seconds": None
            if self.elapsed_seconds is None
            else round(self.elapsed_seconds, 3),
            "dagster_slurm/cpu_efficiency": None
            if self.cpu_efficiency is None
            else round(self.cpu_efficiency, 4),
            "dagster_slurm/max_rss_mb": None
            if self.max_rss_bytes is None
            else round(self.max_rss_bytes / 2**20, 1),
            "dagster_slurm/nodes": self.nodes,
        }
        return values


def from_sacct(job_id: str, record: SacctRecord | None, exit_code: int | None, state: str | None) -> JobMetrics:
    """Metrics of a Slurm job; ``record`` None (no accounting) keeps only what is known."""
    if record is None:
        return JobMetrics("slurm", job_id, state, exit_code, None, None, None, None)
    return JobMetrics(
        mode="slurm",
        job_id=job_id,
        state=record.state.value if record.state else state,
        exit_code=exit_code if exit_code is not None else record.exit_code,
        elapsed_seconds=record.elapsed_seconds,
        cpu_efficiency=record.cpu_efficiency,
        max_rss_bytes=record.max_rss_bytes,
        nodes=record.node_list,
    )


def from_step(allocation_id: str, step: SacctStep | None, step_id: str | None,
              exit_code: int | None, node: str | None) -> JobMetrics:
    """Metrics of one job step of a run allocation (``job_id`` is ``<allocation>.<step>``).

    ``step`` None (no accounting yet, or none at all) keeps only what is known. CPU
    efficiency is CPU-seconds per elapsed second of the step (a step may use several CPUs of
    the allocation, so it can exceed 1, as in local mode).
    """
    job_id = f"{allocation_id}.{step_id}" if step_id else allocation_id
    state = "COMPLETED" if exit_code == 0 else "FAILED"
    if step is None:
        return JobMetrics("slurm", job_id, state, exit_code, None, None, None, node)
    elapsed = step.elapsed_seconds
    efficiency = (None if step.total_cpu_seconds is None or not elapsed
                  else step.total_cpu_seconds / elapsed)
    return JobMetrics(
        mode="slurm", job_id=job_id,
        state=step.state.value if step.state.value != "UNKNOWN" else state,
        exit_code=exit_code, elapsed_seconds=elapsed, cpu_efficiency=efficiency,
        max_rss_bytes=step.max_rss_bytes, nodes=node,
    )


def from_local(
    job_id: str, exit_code: int | None, elapsed: float, cpu_seconds: float | None, max_rss_kib: int | None
) -> JobMetrics:
    """Metrics of a local payload process (``ru_maxrss`` is in KiB on Linux)."""
    efficiency = None if cpu_seconds is None or elapsed <= 0 else cpu_seconds / elapsed
    return JobMetrics(
        mode="local",
        job_id=job_id,
        state="COMPLETED" if exit_code == 0 else "FAILED",
        exit_code=exit_code,
        elapsed_seconds=elapsed,
        cpu_efficiency=efficiency,
        max_rss_bytes=None if max_rss_kib is None else max_rss_kib * 1024,
        nodes="localhost",
    )
