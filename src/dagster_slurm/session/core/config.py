"""``SlurmRunAllocationConfig``: the shape of a run's shared allocation, and shape checks.

Fields left as None inherit the :class:`~dagster_slurm.slurm.queue.SlurmQueueConfig` of the
:class:`~dagster_slurm.resources.slurm.SlurmResource`; ``extra_sbatch_directives`` never
inherits (it applies to one submission). Each value is checked when the configuration is
built, with the queue's rules and in this class's field names (``cpus_per_task``); the
combination with the queue is checked again when the allocation's sbatch request is built,
before anything is submitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dagster import Config
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.directives import validate_extra_sbatch_directives
from dagster_slurm.slurm.queue import (
    SHAPE_VALIDATORS,
    SlurmQueueConfig,
    check_time_combination,
)
from dagster_slurm.slurm.validation import validate_count, validate_hostlist, validate_slurm_name

#: Allocation config field -> SlurmQueueConfig field: the Slurm fields a run allocation and a
#: worker allocation share (and a worker inherits).
QUEUE_FIELDS: Mapping[str, str] = {
    "partition": "partition",
    "num_nodes": "num_nodes",
    "cpus_per_task": "cpus",
    "gpus_per_node": "gpus_per_node",
    "mem": "mem",
    "mem_per_cpu": "mem_per_cpu",
    "time_limit": "time_limit",
    "time_min": "time_min",
    "qos": "qos",
    "account": "account",
    "reservation": "reservation",
    "signal_before_timeout": "signal_before_timeout",
}

#: SlurmQueueConfig field -> the SlurmRunAllocationConfig field a user writes for it.
_OWN_FIELDS: Mapping[str, str] = {
    **{queue: own for own, queue in QUEUE_FIELDS.items()},
    "extra_sbatch_directives": "extra_sbatch_directives",
}

#: SbatchSpec fields that make up an allocation's shape (what a step may not ask to change).
SHAPE_FIELDS: tuple[str, ...] = (
    "partition", "num_nodes", "ntasks", "ntasks_per_node", "cpus_per_task", "mem",
    "mem_per_cpu", "gpus_per_node", "gres", "time_limit", "time_min", "qos", "account",
    "reservation", "nodelist", "exclusive", "extra_directives",
)


def _name_field(cls: Any, value: str | None, info: ValidationInfo) -> str | None:
    if value is None or (info.field_name == "partition" and value == ""):
        return value
    return validate_slurm_name(str(info.field_name), value)


def _count_field(cls: Any, value: int | None, info: ValidationInfo) -> int | None:
    minimum = 0 if info.field_name == "gpus_per_node" else 1
    return None if value is None else validate_count(str(info.field_name), value, minimum=minimum)


def _directives_field(cls: Any, value: list[str]) -> list[str]:
    return list(validate_extra_sbatch_directives(value, field_names=_OWN_FIELDS))


ALLOCATION_VALIDATORS: dict[str, Any] = {
    **SHAPE_VALIDATORS,
    "name": field_validator("partition", "qos", "account", "reservation")(
        classmethod(_name_field)),
    "count": field_validator("num_nodes", "cpus_per_task", "gpus_per_node")(
        classmethod(_count_field)),
    "directives": field_validator("extra_sbatch_directives")(classmethod(_directives_field)),
}
"""Validators of the fields every allocation configuration of a session shares (the run
allocation's and the worker allocations': same names, same rules), assigned in each class
so that they never drift apart; the time, memory and signal rules are the queue's."""


#: Shortest ``heartbeat_timeout`` (seconds) accepted without ``allow_short_heartbeat_timeout``:
#: a shared filesystem may show a new heartbeat to the compute node up to a minute late (NFS
#: attribute and directory caches: ``acregmax``/``acdirmax`` default to 60 s), so a shorter
#: limit can end a live run. 120 s leaves that minute plus several beats of margin.
MIN_SHARED_FS_HEARTBEAT_TIMEOUT = 120.0


def check_heartbeat_timeout(value: float | None, allow_short: bool,
                            field: str = "heartbeat_timeout") -> float | None:
    """``value`` as a dead-man's switch limit in seconds (None: disabled), checked.

    At least 5 s, and at least :data:`MIN_SHARED_FS_HEARTBEAT_TIMEOUT` unless
    ``allow_short`` (the ``allow_short_heartbeat_timeout`` field of the caller). Raises
    :class:`ConfigurationError` naming ``field``. Shared by the run allocation's limit and
    the asset-scope jobs' limit (``ComputeResource.heartbeat_timeout``).
    """
    if value is not None and value < 5:
        raise ConfigurationError(field, value, "must be at least 5 seconds (or None to disable)")
    if value is not None and value < MIN_SHARED_FS_HEARTBEAT_TIMEOUT and not allow_short:
        raise ConfigurationError(
            field, value,
            f"must be at least {MIN_SHARED_FS_HEARTBEAT_TIMEOUT:g} seconds: a shared "
            "filesystem may show a heartbeat to the compute node up to a minute late "
            "(NFS attribute caching), and a shorter limit can cancel a live run. Use 120 "
            "or more, None to disable, or set allow_short_heartbeat_timeout=True where the "
            "library's base path on the cluster is on a filesystem without such caching",
        )
    return value


class SlurmRunAllocationConfig(Config, KnownFieldsOnly):
    """The allocation a run-scoped session submits once and shares between the run's steps.

    Every shape field left as None takes the value of the Slurm resource's queue
    configuration. ``heartbeat_timeout`` is the allocation's dead-man's switch: when no
    supervising process has signalled life for that long, the allocation cancels itself
    (None: never).
    """

    num_nodes: int | None = Field(default=None, description="Nodes (--nodes); None: the queue's.")
    cpus_per_task: int | None = Field(
        default=None, description="CPUs per task (--cpus-per-task); None: the queue's 'cpus'."
    )
    gpus_per_node: int | None = Field(default=None, description="GPUs per node; None: the queue's.")
    mem: str | None = Field(default=None, description="Memory per node (--mem); None: the queue's.")
    mem_per_cpu: str | None = Field(
        default=None, description="Memory per CPU (--mem-per-cpu); replaces mem when set."
    )
    time_limit: str | None = Field(
        default=None, description="Walltime of the allocation (--time); None: the queue's."
    )
    time_min: str | None = Field(
        default=None, description="Shortest walltime backfill may shrink to (--time-min)."
    )
    partition: str | None = Field(default=None, description="Partition; None: the queue's.")
    qos: str | None = Field(default=None, description="QOS; None: the queue's.")
    account: str | None = Field(default=None, description="Account; None: the queue's.")
    reservation: str | None = Field(default=None, description="Reservation; None: the queue's.")
    nodelist: str | None = Field(
        default=None,
        description=(
            "Nodes the allocation must include (--nodelist), e.g. 'gpu-01' or 'gpu-[01-04]'; "
            "never inherited from the queue. A successor allocation asks for the same nodes. "
            "None: any nodes."
        ),
    )
    signal_before_timeout: str | None = Field(
        default=None,
        description=(
            "Drain signal sent to the allocation's batch shell before its walltime, e.g. "
            "'USR1@120'; forwarded to the running steps only. None: the queue's."
        ),
    )
    extra_sbatch_directives: list[str] = Field(
        default_factory=list,
        description=(
            "Further sbatch options for this allocation only, one '--option[=value]' per entry "
            "(never inherited from the queue)."
        ),
    )
    heartbeat_interval: float = Field(
        default=15.0,
        description="Seconds between the supervising process's heartbeats to the session.",
    )
    allow_short_heartbeat_timeout: bool = Field(
        default=False,
        description=(
            "Accept a heartbeat_timeout below 120 s (down to 5 s). Only where the session "
            "directory's filesystem shows a write to every node at once: a single-host test "
            "cluster, local disk, NFS mounted with noac or actimeo=0."
        ),
    )
    heartbeat_timeout: float | None = Field(
        default=600.0,
        description=(
            "Seconds without any supervisor heartbeat after which the allocation cancels "
            "itself (an orphan ends even where no sensor runs); None disables it. At least "
            "120 (a shared filesystem may show a heartbeat late), or 5 with "
            "allow_short_heartbeat_timeout."
        ),
    )
    startup_timeout: float = Field(
        default=600.0,
        description=(
            "Seconds a running allocation may take to accept steps (Ray startup included) "
            "before the step fails and the allocation is cancelled."
        ),
    )

    _check_name = ALLOCATION_VALIDATORS["name"]
    _check_count = ALLOCATION_VALIDATORS["count"]
    _check_time = ALLOCATION_VALIDATORS["time"]
    _check_memory = ALLOCATION_VALIDATORS["memory"]
    _check_signal = ALLOCATION_VALIDATORS["signal"]
    _check_directives = ALLOCATION_VALIDATORS["directives"]

    @field_validator("nodelist")
    @classmethod
    def _check_nodelist(cls, value: str | None) -> str | None:
        return None if value is None else validate_hostlist("nodelist", value)

    @field_validator("heartbeat_interval", "startup_timeout")
    @classmethod
    def _positive(cls, value: float, info: Any) -> float:
        if not value > 0:
            raise ConfigurationError(str(info.field_name), value, "must be a positive number of seconds")
        return value

    @field_validator("heartbeat_timeout")
    @classmethod
    def _timeout(cls, value: float | None, info: Any) -> float | None:
        return check_heartbeat_timeout(value, bool(info.data.get("allow_short_heartbeat_timeout")))

    @model_validator(mode="after")
    def _check_combination(self) -> SlurmRunAllocationConfig:
        check_time_combination(self.time_limit, self.time_min, self.signal_before_timeout)
        if self.heartbeat_timeout is not None and self.heartbeat_timeout <= 2 * self.heartbeat_interval:
            raise ConfigurationError(
                "heartbeat_timeout", self.heartbeat_timeout,
                f"must exceed twice heartbeat_interval ({self.heartbeat_interval} s)",
            )
        return self

    def queue_for(self, queue: SlurmQueueConfig) -> SlurmQueueConfig:
        """``queue`` with this configuration's fields applied; checked as a whole (times,
        signal, directives). A bad combination raises :class:`ConfigurationError` naming
        the field as this class spells it (``cpus_per_task``) and the value."""
        values = queue.model_dump()
        values["extra_sbatch_directives"] = list(self.extra_sbatch_directives)
        # Never requeued: a restarted allocation would start an idle step server while its
        # steps wait on the first start; the session replaces a lost allocation itself.
        values["requeue"] = False
        for name, target in QUEUE_FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                values[target] = value
        if self.mem_per_cpu is not None:
            values["mem"] = None
        elif self.mem is not None:
            values["mem_per_cpu"] = None
        try:
            return SlurmQueueConfig(**values)
        except ValidationError as error:
            raise in_own_words(error) from None

    def sbatch_options(self) -> dict[str, Any]:
        """The :class:`SbatchSpec` fields of this configuration that a queue configuration
        has no field for (``nodelist`` when set), to add to the allocation's request built
        from :meth:`queue_for`; empty when none is set."""
        return {"nodelist": self.nodelist} if self.nodelist is not None else {}

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able copy, recorded in the session document with the allocation. An unset
        ``nodelist`` is left out, so a configuration without one has the snapshot (and the
        session digest) it had before the field existed."""
        data = self.model_dump(mode="json")
        if data.get("nodelist") is None:
            data.pop("nodelist", None)
        return data


def in_own_words(error: ValidationError, owner: str = "SlurmRunAllocationConfig",
                  source: str = "the Slurm resource's queue configuration") -> Exception:
    """The first problem of a combined queue configuration, as a :class:`ConfigurationError`
    naming the field as ``owner`` spells it (``cpus`` becomes ``cpus_per_task``); ``source``
    says where the fields left None took their values from."""
    for detail in error.errors():
        cause = (detail.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigurationError):
            base, bracket, rest = cause.field.partition("[")
            field = _OWN_FIELDS.get(base, base) + bracket + rest
            return ConfigurationError(
                field, cause.value,
                f"{cause.problem} (fields of {owner} left None take the values of {source})",
            )
    return error


_MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _megabytes(value: object) -> float | None:
    """A Slurm memory size (``4096``, ``4096M``, ``4G``) in megabytes; None if unreadable."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().upper()
    unit = text[-1] if text[-1] in _MEMORY_UNITS else "M"
    number = text[:-1] if text[-1] in _MEMORY_UNITS else text
    try:
        return float(number) * _MEMORY_UNITS[unit]
    except ValueError:
        return None


def shape_mismatches(allocation: SbatchSpec, overrides: Mapping[str, Any]) -> list[str]:
    """Descriptions of the ``overrides`` (SbatchSpec fields) that differ from ``allocation``.

    Values are compared after normalisation (``60`` and ``01:00:00`` are the same walltime).
    Asking for ``mem`` when the allocation has ``mem_per_cpu`` (or the reverse) differs.
    """
    if not overrides:
        return []
    changes = dict(overrides)
    if "mem" in changes and "mem_per_cpu" not in changes:
        changes["mem_per_cpu"] = None
    if "mem_per_cpu" in changes and "mem" not in changes:
        changes["mem"] = None
    asked = dataclasses.replace(allocation, **changes)  # validates the values
    problems = []
    for name in overrides:
        if name not in SHAPE_FIELDS:
            continue
        mine, theirs = getattr(asked, name), getattr(allocation, name)
        if name in ("mem", "mem_per_cpu"):
            if mine is None:
                continue
            if _megabytes(mine) == _megabytes(theirs):
                continue
        if mine != theirs:
            problems.append(f"{name}: the step asks for {mine!r}, the run allocation has {theirs!r}")
    return problems


def check_shape(
    config: SlurmRunAllocationConfig,
    queue: SlurmQueueConfig,
    overrides: Mapping[str, Any],
    extra_slurm_opts: Mapping[str, Any] | None,
) -> SbatchSpec:
    """The run allocation's request; raises naming each field where ``overrides`` (a step's
    ``extra_slurm_opts``, as SbatchSpec fields) differ from it."""
    spec = config.queue_for(queue).to_sbatch_spec("dsr-shape-check", "/dev/null",
                                                  **config.sbatch_options())
    refuse_mismatches(spec, overrides, extra_slurm_opts)
    return spec


def refuse_mismatches(
    allocation: SbatchSpec, overrides: Mapping[str, Any], extra_slurm_opts: Mapping[str, Any] | None
) -> None:
    """Raise :class:`ConfigurationError` (field ``extra_slurm_opts``) naming each field where
    ``overrides`` differ from the ``allocation``'s request, with both values."""
    problems = shape_mismatches(allocation, overrides)
    if problems:
        raise ConfigurationError(
            "extra_slurm_opts", dict(extra_slurm_opts or {}),
            "the step asks for another shape than the run allocation ("
            + "; ".join(problems) + "). Move shared settings into SlurmRunAllocationConfig, or "
            "run this asset with allocation_scope='asset'",
        )
