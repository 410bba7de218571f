"""Job figures that become materialization metadata, with the same keys in both modes.

Slurm mode fills them from ``sacct``; local mode from the payload process's resource usage.
Every key is always present, so an asset's metadata has the same keys in both modes; a figure
that could not be observed is a null value, never 0. Node-hours and the GPU figures come only
from accounting (null in local mode, and where the site's accounting does not record GPUs).
The cost figures (CPU- and GPU-hours, memory efficiency, queue wait) are computed by
:func:`~dagster_slurm.jobs.cost.cost_figures` from the same figures, null where one they
need is not known.
The same figures under the published package's key names (``slurm_job_id``,
``node_hours``, ...) are added on request (:mod:`dagster_slurm.jobs.published_metadata`).

A job that ended is never reported with a state it has left (PENDING, RUNNING, ...):
accounting that does not show a final state yet (slurmdbd has not caught up) gives no
state and no figures but the queue wait the library observed itself; the state then comes
from what the library observed itself (the last ``squeue``, the job's exit-status file) and
``dagster_slurm/state_source`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_slurm.jobs.cost import cost_figures
from dagster_slurm.slurm.accounting import SacctRecord, SacctStep
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.tres import NO_GPU_FIGURES, GpuFigures

#: Metadata keys a compute invocation attaches (each always present; None when not known).
METADATA_KEYS = (
    "dagster_slurm/mode",
    "dagster_slurm/job_id",
    "dagster_slurm/state",
    "dagster_slurm/state_source",
    "dagster_slurm/exit_code",
    "dagster_slurm/elapsed_seconds",
    "dagster_slurm/cpu_efficiency",
    "dagster_slurm/max_rss_mb",
    "dagster_slurm/nodes",
    "dagster_slurm/node_hours",
    "dagster_slurm/gpus",
    "dagster_slurm/gpus_requested",
    "dagster_slurm/gpu_utilization_avg_pct",
    "dagster_slurm/gpu_utilization_max_pct",
    "dagster_slurm/gpu_utilization_max_node",
    "dagster_slurm/gpu_memory_max_mb",
    "dagster_slurm/cpu_hours",
    "dagster_slurm/gpu_hours",
    "dagster_slurm/memory_efficiency",
    "dagster_slurm/queue_wait_seconds",
)

#: The figures of :func:`~dagster_slurm.jobs.cost.cost_figures` among :data:`METADATA_KEYS`
#: (``dagster_slurm/cpu_efficiency`` is reported as before, from the job's own figure).
COST_KEYS = ("dagster_slurm/cpu_hours", "dagster_slurm/gpu_hours",
             "dagster_slurm/memory_efficiency", "dagster_slurm/queue_wait_seconds")

#: ``state_source`` values: where a reported state was read.
SOURCE_SACCT = "sacct"
SOURCE_STATUS_FILE = "status_file"
SOURCE_PROCESS = "process"


@dataclass(frozen=True)
class JobMetrics:
    """Figures of one finished job; None means not observed.

    ``state`` is a final state (never PENDING, RUNNING, ...) or None when no source showed
    one; ``state_source`` says where it was read (``sacct``, ``squeue``, ``status_file``,
    ``process`` in local mode), None exactly when ``state`` is None. ``job_id`` is the
    job's id, or ``<allocation>.<step>`` for a step of a run allocation (``step_id`` is then
    the part after the dot; None for a whole job). ``node_hours`` is elapsed time × the
    nodes it occupied, in hours, from accounting; ``cpus`` the CPUs accounting shows for
    the job or step (None when unknown); ``gpu`` the GPU figures accounting recorded (None
    fields where it recorded none). ``requested_mem_bytes`` is the memory the job asked for
    per node (None: none asked for, or unknown, as for a step and in local mode), and
    ``queue_wait_seconds`` the time from submission to start (see :func:`queue_wait`; None
    when not known; in local mode None, but for a partition's process the time it waited
    for a place in the pool).
    """

    mode: str
    job_id: str
    state: str | None
    exit_code: int | None
    elapsed_seconds: float | None
    cpu_efficiency: float | None
    max_rss_bytes: int | None
    nodes: str | None
    state_source: str | None = None
    node_hours: float | None = None
    gpu: GpuFigures = NO_GPU_FIGURES
    step_id: str | None = None
    cpus: int | None = None
    requested_mem_bytes: int | None = None
    queue_wait_seconds: float | None = None

    @property
    def from_accounting(self) -> bool:
        """Whether the figures come from a final ``sacct`` record (else they are null)."""
        return self.mode == "slurm" and self.state_source == SOURCE_SACCT

    def as_metadata(self) -> dict[str, object | None]:
        """The metadata: every key of :data:`METADATA_KEYS` (None where not observed)."""
        values: dict[str, object | None] = {
            "dagster_slurm/mode": self.mode,
            "dagster_slurm/job_id": self.job_id,
            "dagster_slurm/state": self.state,
            "dagster_slurm/state_source": self.state_source if self.state is not None else None,
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
            "dagster_slurm/node_hours": _rounded(self.node_hours, 6),
            "dagster_slurm/gpus": self.gpu.allocated,
            "dagster_slurm/gpus_requested": self.gpu.requested,
            "dagster_slurm/gpu_utilization_avg_pct": _rounded(self.gpu.utilization_avg_pct, 2),
            "dagster_slurm/gpu_utilization_max_pct": _rounded(self.gpu.utilization_max_pct, 2),
            "dagster_slurm/gpu_utilization_max_node": self.gpu.utilization_max_node,
            "dagster_slurm/gpu_memory_max_mb": None if self.gpu.memory_max_bytes is None
            else round(self.gpu.memory_max_bytes / 2**20, 1),
        }
        values.update({key: value for key, value in self.cost().items() if key in COST_KEYS})
        return values

    def cost(self) -> dict[str, float | None]:
        """The figures of :func:`~dagster_slurm.jobs.cost.cost_figures` for this job: CPU-hours
        from ``cpus`` (None without: local mode, or no accounting), GPU-hours from the GPUs
        accounting shows allocated (None where it shows none: a job without GPUs and a site
        that does not record them look the same, so no 0 is made up), memory efficiency from
        MaxRSS over ``requested_mem_bytes``, and ``queue_wait_seconds``."""
        return cost_figures(
            elapsed_seconds=self.elapsed_seconds, cpus=self.cpus, gpus=self.gpu.allocated,
            max_rss_bytes=self.max_rss_bytes, requested_mem_bytes=self.requested_mem_bytes,
            cpu_efficiency=self.cpu_efficiency, queue_wait_seconds=self.queue_wait_seconds)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def queue_wait(planned_seconds: float | None, observed: float | None) -> float | None:
    """A Slurm job's wait in the queue, in seconds: Slurm's own figure (``planned_seconds``,
    the ``Planned`` column of Slurm 23.02 and later) when accounting gave one, else the
    wait the library ``observed`` (:func:`observed_wait`), else None."""
    return planned_seconds if planned_seconds is not None else observed


def observed_wait(submitted_at: float | None, started_at: float | None) -> float | None:
    """The queue wait the library saw: ``started_at - submitted_at`` on one clock of the
    submitting process, taken when sbatch answered and at the first status poll that saw
    the job started. It is therefore late by up to one poll interval (plus the submission's
    round trip); None when either moment is unknown (the job ended before any poll saw it
    running)."""
    if submitted_at is None or started_at is None:
        return None
    return max(0.0, started_at - submitted_at)


def final_state(state: str | JobState | None) -> str | None:
    """``state``'s name when it is a final state, else None (PENDING, RUNNING, unreadable)."""
    parsed = state if isinstance(state, JobState) else JobState.parse(state)
    return parsed.value if parsed.terminal else None


def from_sacct(job_id: str, record: SacctRecord | None, exit_code: int | None, state: str | None,
               source: str | None = None, nodes: str | None = None, *,
               requested_mem_bytes: int | None = None,
               observed_wait: float | None = None) -> JobMetrics:
    """Metrics of a Slurm job from its accounting ``record`` and what was observed.

    A ``record`` with a final state gives the state (source ``sacct``) and every figure.
    Otherwise (``record`` None: no accounting, sacct failed; or a record that has not
    caught up) no figure of the record is used, since a record that still says PENDING or
    RUNNING describes the job as slurmdbd last heard of it (elapsed 0, or the time until
    then): the state is the observed ``state`` with its ``source`` (e.g. ``squeue``), the
    node list the observed ``nodes``, and every other figure is None. An observed state
    that is not final is not reported either (state and source None). ``exit_code`` is the
    payload's code from its status file; without one, a final record's exit code is used.
    ``requested_mem_bytes`` is what the job asked for per node; the queue wait is the final
    record's ``Planned`` when it has one, else ``observed_wait`` (see :func:`queue_wait`).
    """
    if record is not None and record.state.terminal:
        return JobMetrics(
            mode="slurm",
            job_id=job_id,
            state=record.state.value,
            exit_code=exit_code if exit_code is not None else record.exit_code,
            elapsed_seconds=record.elapsed_seconds,
            cpu_efficiency=record.cpu_efficiency,
            max_rss_bytes=record.max_rss_bytes,
            nodes=record.node_list,
            state_source=SOURCE_SACCT,
            node_hours=record.node_hours,
            gpu=record.gpu,
            cpus=record.alloc_cpus,
            requested_mem_bytes=requested_mem_bytes,
            queue_wait_seconds=queue_wait(record.planned_seconds, observed_wait),
        )
    observed = final_state(state)
    return JobMetrics("slurm", job_id, observed, exit_code, None, None, None, nodes,
                      state_source=source if observed is not None else None,
                      requested_mem_bytes=requested_mem_bytes, queue_wait_seconds=observed_wait)


def from_step(allocation_id: str, step: SacctStep | None, step_id: str | None,
              exit_code: int | None, node: str | None) -> JobMetrics:
    """Metrics of one job step of a run allocation (``job_id`` is ``<allocation>.<step>``).

    A ``step`` line with a final state gives the state (source ``sacct``) and the figures.
    Otherwise (``step`` None: no accounting yet, or none at all; or its line still says
    RUNNING) the state comes from the step's exit-status file (source ``status_file``):
    COMPLETED for 0, FAILED for another code, None without one; the figures are then
    None. CPU efficiency is CPU-seconds per elapsed second of the step (a step may use
    several CPUs of the allocation, so it can exceed 1, as in local mode). Node-hours and
    the GPU figures are the step's own (its elapsed time × its nodes; its line's TRES), and
    so are its CPU-hours (its elapsed time × its CPUs). A step's queue wait and memory
    efficiency are None: when the step server started the step after it was asked for is
    not recorded, and a step asks for no memory of its own (it shares the allocation's).
    """
    job_id = f"{allocation_id}.{step_id}" if step_id else allocation_id
    if step is None or not step.state.terminal:
        state = None if exit_code is None else ("COMPLETED" if exit_code == 0 else "FAILED")
        return JobMetrics("slurm", job_id, state, exit_code, None, None, None, node,
                          state_source=SOURCE_STATUS_FILE if state is not None else None,
                          step_id=step_id or None)
    elapsed = step.elapsed_seconds
    efficiency = (None if step.total_cpu_seconds is None or not elapsed
                  else step.total_cpu_seconds / elapsed)
    return JobMetrics(
        mode="slurm", job_id=job_id, state=step.state.value, exit_code=exit_code,
        elapsed_seconds=elapsed, cpu_efficiency=efficiency,
        max_rss_bytes=step.max_rss_bytes, nodes=node, state_source=SOURCE_SACCT,
        node_hours=step.node_hours, gpu=step.gpu, step_id=step_id or None,
        cpus=step.alloc_cpus,
    )


def from_local(
    job_id: str, exit_code: int | None, elapsed: float, cpu_seconds: float | None, max_rss_kib: int | None
) -> JobMetrics:
    """Metrics of a local payload process (``ru_maxrss`` is in KiB on Linux); no
    node-hours, GPU figures, CPU-hours or memory efficiency (there is no allocation: no
    CPUs or memory were allocated, and no accounting) and no queue wait (no queue)."""
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
        state_source=SOURCE_PROCESS,
    )
