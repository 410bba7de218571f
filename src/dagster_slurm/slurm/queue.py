"""``SlurmQueueConfig``: the user-facing defaults for what a job asks the scheduler for.

A Dagster :class:`~dagster.Config`, so it can be nested in a ``ConfigurableResource`` and set
from run config. Field names follow the published dagster-slurm library (``partition``,
``num_nodes``, ``time_limit``, ``cpus``, ``gpus_per_node``, ``mem``, ``mem_per_cpu``,
``qos``, ``reservation``, ``account``, ``signal_before_timeout``). Values are checked on
construction; an invalid value fails with a message naming the field and the value.
:meth:`SlurmQueueConfig.to_sbatch_spec` turns the configuration into an
:class:`~dagster_slurm.slurm.commands.SbatchSpec`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from dagster import Config
from pydantic import Field, ValidationInfo, field_validator, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.array_spec import validate_array_parallelism
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.directives import validate_extra_sbatch_directives
from dagster_slurm.slurm.validation import (
    signal_lead_seconds,
    validate_count,
    validate_memory,
    validate_sbatch_signal,
    validate_slurm_name,
)
from dagster_slurm.slurm.walltime import parse_duration, validate_walltime

_UNDRAINABLE_SIGNALS = frozenset({"KILL", "STOP", "9", "19"})
_SPEC_FIELDS = frozenset(f.name for f in fields(SbatchSpec)) - {"job_name", "script_path"}


def _walltime_field(cls: Any, value: str | None, info: ValidationInfo) -> str | None:
    return None if value is None else validate_walltime(str(info.field_name), value)


def _memory_field(cls: Any, value: str | None, info: ValidationInfo) -> str | None:
    return None if value is None else validate_memory(str(info.field_name), value)


def _signal_field(cls: Any, value: str | None) -> str | None:
    return None if value is None else validate_drain_signal_spec("signal_before_timeout", value)


SHAPE_VALIDATORS: dict[str, Any] = {
    "time": field_validator("time_limit", "time_min")(classmethod(_walltime_field)),
    "memory": field_validator("mem", "mem_per_cpu")(classmethod(_memory_field)),
    "signal": field_validator("signal_before_timeout")(classmethod(_signal_field)),
}
"""Validators of the shape fields a queue and a run allocation share (same names, same
rules), assigned in both classes so that the two never drift apart."""


class SlurmQueueConfig(Config, KnownFieldsOnly):
    """Default scheduler request of a job: partition, shape, walltime and accounting.

    ``None`` (and, for ``partition``, an empty string) leaves a value to the scheduler's
    partition defaults. ``mem_per_cpu``, when set, replaces ``mem``.
    """

    partition: str | None = Field(
        default=None, description="Slurm partition; None or '' uses the cluster's default."
    )
    num_nodes: int = Field(default=1, description="Number of nodes (--nodes).")
    time_limit: str = Field(
        default="00:30:00",
        description="Walltime (--time), any Slurm format: 'MM', 'HH:MM:SS', 'D-HH:MM:SS'.",
    )
    time_min: str | None = Field(
        default=None,
        description=(
            "Shortest walltime the backfill scheduler may shrink time_limit to (--time-min); "
            "positive, at most time_limit and longer than the signal's lead time."
        ),
    )
    signal_before_timeout: str | None = Field(
        default=None,
        description=(
            "Signal sent to the batch shell before the walltime, e.g. 'TERM@120' (seconds "
            "before the end; 60 when left out). Slurm may deliver it up to 60 s early."
        ),
    )
    cpus: int = Field(default=2, description="CPUs per task (--cpus-per-task).")
    gpus_per_node: int = Field(default=0, description="GPUs per node; 0 requests none.")
    mem: str | None = Field(
        default="4096M",
        description="Memory per node (--mem), e.g. '4096M' or '16G'; None uses the default.",
    )
    mem_per_cpu: str | None = Field(
        default=None, description="Memory per CPU (--mem-per-cpu); replaces mem when set."
    )
    qos: str | None = Field(default=None, description="Quality of service (--qos).")
    reservation: str | None = Field(default=None, description="Reservation (--reservation).")
    account: str | None = Field(default=None, description="Account charged (--account).")
    requeue: bool = Field(
        default=False,
        description=(
            "Whether Slurm may start an asset-scope job again from the beginning after a node "
            "failure, a preemption or 'scontrol requeue' (--requeue). False (the default) "
            "submits with --no-requeue: such a job fails instead, because a restarted payload "
            "is only safe when it is idempotent. True: the step logs each requeue before the "
            "payload starts again. Run allocations are never requeued."
        ),
    )
    array_parallelism: int | None = Field(
        default=None,
        description=(
            "A run over several partition keys runs as a job array: at most this many of "
            "its tasks run at once (Slurm's --array=...%N). None: as many as the scheduler "
            "starts. compute.run(array_parallelism=...) overrides it per call."
        ),
    )
    extra_sbatch_directives: list[str] = Field(
        default_factory=list,
        description=(
            "Further sbatch options, one long-form '--option[=value]' per entry, e.g. "
            "'--constraint=a100'. Options with a field above are rejected."
        ),
    )

    @field_validator("partition", "qos", "reservation", "account")
    @classmethod
    def _check_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or (info.field_name == "partition" and value == ""):
            return None
        return validate_slurm_name(str(info.field_name), value)

    @field_validator("array_parallelism")
    @classmethod
    def _check_parallelism(cls, value: int | None) -> int | None:
        return validate_array_parallelism("array_parallelism", value)

    @field_validator("num_nodes", "cpus")
    @classmethod
    def _check_positive(cls, value: int, info: ValidationInfo) -> int:
        return validate_count(str(info.field_name), value)

    @field_validator("gpus_per_node")
    @classmethod
    def _check_gpus(cls, value: int) -> int:
        return validate_count("gpus_per_node", value, minimum=0)

    _check_time = SHAPE_VALIDATORS["time"]
    _check_memory = SHAPE_VALIDATORS["memory"]
    _check_signal = SHAPE_VALIDATORS["signal"]

    @field_validator("extra_sbatch_directives")
    @classmethod
    def _check_directives(cls, value: list[str]) -> list[str]:
        return list(validate_extra_sbatch_directives(value))

    @model_validator(mode="after")
    def _check_times(self) -> SlurmQueueConfig:
        check_time_combination(self.time_limit, self.time_min, self.signal_before_timeout)
        return self

    def to_sbatch_spec(self, job_name: str, script_path: str, **overrides: Any) -> SbatchSpec:
        """An :class:`SbatchSpec` for this configuration, ``overrides`` taking precedence.

        ``overrides`` use :class:`SbatchSpec` field names (``comment``, ``output``,
        ``nodelist``, ``cpus_per_task``, ...). Overriding ``mem`` or ``mem_per_cpu``
        replaces the configured memory setting of either form. Unknown names raise
        :class:`TypeError`; invalid values raise
        :class:`~dagster_slurm.errors.ConfigurationError`.
        """
        unknown = sorted(set(overrides) - _SPEC_FIELDS)
        if unknown:
            raise TypeError(f"unknown SbatchSpec field(s) in overrides: {', '.join(unknown)}")
        values: dict[str, Any] = {
            "partition": self.partition,
            "qos": self.qos,
            "account": self.account,
            "reservation": self.reservation,
            "time_limit": self.time_limit,
            "time_min": self.time_min,
            "num_nodes": self.num_nodes,
            "cpus_per_task": self.cpus,
            "gpus_per_node": self.gpus_per_node or None,
            "mem": None if self.mem_per_cpu is not None else self.mem,
            "mem_per_cpu": self.mem_per_cpu,
            "signal": (f"B:{self.signal_before_timeout}" if self.signal_before_timeout else None),
            "extra_directives": tuple(self.extra_sbatch_directives),
            "requeue": self.requeue,
        }
        if "mem" in overrides or "mem_per_cpu" in overrides:
            values["mem"] = values["mem_per_cpu"] = None
        values.update(overrides)
        return SbatchSpec(job_name=job_name, script_path=script_path, **values)


def validate_drain_signal_spec(field: str, value: str) -> str:
    """A ``signal_before_timeout`` value ``<signal>@<seconds>``, normalised (``TERM@60``).

    Without a ``B:``/``R:`` prefix (it always goes to the batch shell), and never KILL or
    STOP (they cannot be handled, so they give no drain window).
    """
    if ":" in value:
        raise ConfigurationError(
            field, value, "give '<signal>@<seconds>' without a prefix; it goes to the batch shell"
        )
    spec = validate_sbatch_signal(field, value)
    name = spec.partition("@")[0]
    if name in _UNDRAINABLE_SIGNALS:
        raise ConfigurationError(
            field, value, "KILL and STOP cannot be handled, so they give no drain window"
        )
    return f"{name}@{signal_lead_seconds(spec)}"


def check_time_combination(
    time_limit: str | None, time_min: str | None, signal_before_timeout: str | None
) -> None:
    """Raise :class:`ConfigurationError` when validated walltime fields contradict each
    other: ``time_min`` above ``time_limit``, or the signal's lead time not shorter than
    ``time_limit`` or not shorter than ``time_min``. A None value is not compared."""
    limit = parse_duration(time_limit) if time_limit is not None else None
    minimum = parse_duration(time_min) if time_min is not None else None
    lead = signal_lead_seconds(signal_before_timeout) if signal_before_timeout is not None else None
    if limit is not None and minimum is not None and minimum > limit:
        raise ConfigurationError("time_min", time_min, f"must not exceed time_limit={time_limit!r}")
    if lead is not None and limit is not None and lead >= limit:
        raise ConfigurationError(
            "signal_before_timeout",
            signal_before_timeout,
            f"the lead time ({lead} s) must be shorter than time_limit={time_limit!r}",
        )
    if lead is not None and minimum is not None and minimum <= lead:
        raise ConfigurationError(
            "time_min",
            time_min,
            f"must be longer than the signal's lead time ({lead} s, "
            f"signal_before_timeout={signal_before_timeout!r})",
        )
