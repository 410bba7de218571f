"""The ``sbatch`` submission of one batch job as a validated value (pure).

:class:`SbatchSpec` checks every field on construction, so that a mistake is reported with
the offending field and value before anything reaches the cluster;
:func:`~dagster_slurm.slurm.commands.sbatch_argv` turns it into the argv (and
:mod:`dagster_slurm.slurm.commands` re-exports it, where callers import it from).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.array_spec import validate_array_expression
from dagster_slurm.slurm.directives import validate_extra_sbatch_directives
from dagster_slurm.slurm.hetjob import HetComponentSpec
from dagster_slurm.slurm.validation import (
    MAX_COMMENT_LENGTH,
    validate_count,
    validate_export,
    validate_gres,
    validate_hostlist,
    validate_job_name,
    validate_memory,
    validate_sbatch_signal,
    validate_slurm_name,
    validate_text,
)
from dagster_slurm.slurm.walltime import parse_duration, validate_walltime

__all__ = ["SbatchSpec"]


@dataclass(frozen=True)
class SbatchSpec:
    """Everything :func:`~dagster_slurm.slurm.commands.sbatch_argv` passes to ``sbatch`` for one batch job.

    Each optional field left as None is not passed at all, so the scheduler's (partition's)
    default applies. Values are validated on construction; an invalid one raises
    :class:`~dagster_slurm.errors.ConfigurationError` naming the field. ``time_limit`` and
    ``time_min`` are stored in canonical ``[D-]HH:MM:SS`` form.
    """

    job_name: str
    """``--job-name``; also what :func:`~dagster_slurm.slurm.commands.squeue_argv` filters on."""
    script_path: str
    """Path of the batch script on the cluster; passed last."""
    partition: str | None = None
    """``--partition`` (a comma list lets Slurm pick the first that fits)."""
    qos: str | None = None
    """``--qos``: quality of service."""
    account: str | None = None
    """``--account`` charged for the job."""
    reservation: str | None = None
    """``--reservation`` to run in."""
    time_limit: str | None = None
    """``--time``: the walltime, any Slurm duration format or ``UNLIMITED``."""
    time_min: str | None = None
    """``--time-min``: the shortest walltime the backfill scheduler may shrink ``time_limit`` to."""
    num_nodes: int | None = None
    """``--nodes``: number of nodes."""
    ntasks: int | None = None
    """``--ntasks``: total number of tasks."""
    ntasks_per_node: int | None = None
    """``--ntasks-per-node``."""
    cpus_per_task: int | None = None
    """``--cpus-per-task``."""
    mem: str | None = None
    """``--mem``: memory per node, e.g. ``4096M``; exclusive with ``mem_per_cpu``."""
    mem_per_cpu: str | None = None
    """``--mem-per-cpu``; exclusive with ``mem``."""
    gpus_per_node: int | None = None
    """``--gpus-per-node``."""
    gres: str | None = None
    """``--gres``, e.g. ``gpu:a100:2``."""
    signal: str | None = None
    """``--signal``: ``[{R|B}:]<signal>[@<seconds before the time limit>]``, e.g. ``B:USR1@60``."""
    comment: str | None = None
    """``--comment``: free text (no newlines), readable back with ``squeue %k``."""
    output: str | None = None
    """``--output``: stdout file pattern."""
    error: str | None = None
    """``--error``: stderr file pattern."""
    chdir: str | None = None
    """``--chdir``: working directory of the batch script."""
    nodelist: str | None = None
    """``--nodelist``: host list the job must include, e.g. ``c[1-2]``."""
    exclusive: bool = False
    """``--exclusive`` when True: no sharing of the nodes with other jobs."""
    hold: bool = False
    """``--hold`` when True: submit held (priority 0) until released."""
    requeue: bool = False
    """``--requeue`` when True, ``--no-requeue`` when False (always passed, so a site's
    ``JobRequeue`` default never decides): whether Slurm may start the job again from the
    beginning after a node failure, a preemption or ``scontrol requeue``."""
    export: str | None = "ALL"
    """``--export``: which environment variables reach the job (default ``ALL``)."""
    extra_directives: tuple[str, ...] = ()
    """Further long-form options, checked by
    :func:`~dagster_slurm.slurm.directives.validate_extra_sbatch_directives`."""
    array: str | None = None
    """``--array``: the task indices of a job array with an optional ``%<max running>``, as
    built by :func:`~dagster_slurm.slurm.arrays.array_expression`; None: an ordinary job."""
    het_components: tuple[HetComponentSpec, ...] = ()
    """The later components of a heterogeneous job (see :mod:`dagster_slurm.slurm.hetjob`);
    the fields above are then component 0 and the job's. Empty: an ordinary job."""

    def __post_init__(self) -> None:
        validate_job_name("job_name", self.job_name)
        validate_text("script_path", self.script_path)
        for name in ("partition", "qos", "account", "reservation"):
            _optional(name, getattr(self, name), validate_slurm_name)
        for name in ("num_nodes", "ntasks", "ntasks_per_node", "cpus_per_task", "gpus_per_node"):
            _optional(name, getattr(self, name), validate_count)
        for name in ("mem", "mem_per_cpu"):
            _optional(name, getattr(self, name), validate_memory)
        if self.mem is not None and self.mem_per_cpu is not None:
            raise ConfigurationError(
                "mem_per_cpu", self.mem_per_cpu, f"cannot be combined with mem={self.mem!r}"
            )
        _optional("gres", self.gres, validate_gres)
        _optional("nodelist", self.nodelist, validate_hostlist)
        _optional("export", self.export, validate_export)
        _optional("comment", self.comment, _validate_comment)
        _optional("array", self.array, validate_array_expression)
        for name in ("output", "error", "chdir"):
            _optional(name, getattr(self, name), validate_text)
        for name in ("exclusive", "hold", "requeue"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(name, getattr(self, name), "must be True or False")
        for index, component in enumerate(self.het_components):
            if not isinstance(component, HetComponentSpec):
                raise ConfigurationError(
                    f"het_components[{index}]", component, "must be a HetComponentSpec"
                )
        if self.array is not None and self.het_components:
            raise ConfigurationError(
                "array", self.array,
                "cannot be combined with het_components: Slurm runs no heterogeneous job arrays"
            )
        self._normalise()

    def _normalise(self) -> None:
        """Store canonical forms of the time and signal fields (validating them)."""
        limit = _optional("time_limit", self.time_limit, validate_walltime)
        minimum = _optional("time_min", self.time_min, validate_walltime)
        if limit is not None and minimum is not None:
            if (parse_duration(minimum) or 0.0) > (parse_duration(limit) or 0.0):
                raise ConfigurationError(
                    "time_min", self.time_min, f"must not exceed time_limit={self.time_limit!r}"
                )
        signal = _optional("signal", self.signal, validate_sbatch_signal)
        extra = validate_extra_sbatch_directives(self.extra_directives, field="extra_directives")
        object.__setattr__(self, "time_limit", limit)
        object.__setattr__(self, "time_min", minimum)
        object.__setattr__(self, "signal", signal)
        object.__setattr__(self, "extra_directives", extra)
        object.__setattr__(self, "het_components", tuple(self.het_components))


def _validate_comment(field: str, value: object) -> str:
    return validate_text(field, value, max_length=MAX_COMMENT_LENGTH)


_T = TypeVar("_T")


def _optional(field: str, value: object, check: Callable[[str, object], _T]) -> _T | None:
    """``check(field, value)`` unless ``value`` is None (the option is then not passed)."""
    return None if value is None else check(field, value)
