"""Worker allocations and a separate head: their configuration and how it inherits.

:class:`SlurmWorkerAllocationConfig` describes one worker allocation: a Slurm job whose
nodes join the run's Ray cluster as workers. Its Slurm fields left None inherit, in
:func:`resolve_worker_config`, from the session's first worker allocation or, when the
session has none, from the head allocation; the fields of one submission
(:data:`PER_SUBMISSION_FIELDS`: ``nodelist``, ``extra_sbatch_directives``,
``ray_resources``, ``ray_start_args``, ``rejoin_timeout``) never inherit. Setting ``mem`` or
``mem_per_cpu`` replaces the inherited memory setting of either form.

A separate head (``ComputeResource(ray_head_allocation=SlurmRunAllocationConfig(...))``)
follows other rules than a compute allocation: :func:`check_head_allocation` requires an
explicit ``partition`` and ``time_limit``, and :func:`head_queue_config` gives its request:
one node, 2 CPUs, 8 GB and no GPUs unless set, the queue's account, QoS and reservation, and
nothing else of the queue (the queue's defaults describe compute jobs).

Every function here is pure: configurations in, configurations out; values are checked with
the rules of :class:`~dagster_slurm.session.core.config.SlurmRunAllocationConfig` (the same
validators), and errors name the field as the user spelled it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from dagster import Config
from pydantic import Field, ValidationError, field_validator, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.ray import RAY_MANAGED_OPTIONS
from dagster_slurm.session.core.config import (
    ALLOCATION_VALIDATORS,
    QUEUE_FIELDS,
    SlurmRunAllocationConfig,
    in_own_words,
)
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.directives import OptionRules, validate_option_entries
from dagster_slurm.slurm.queue import SlurmQueueConfig, check_time_combination
from dagster_slurm.slurm.validation import validate_hostlist

#: Ray custom resource every worker node offers (one per node), so that helpers can stay
#: off the head with ``resources={"dagster_slurm_worker": 0.01}``.
WORKER_RESOURCE = "dagster_slurm_worker"

#: Seconds a worker allocation without a live head waits before it releases itself.
DEFAULT_REJOIN_TIMEOUT = 600.0

#: Own field -> SlurmQueueConfig field, for every Slurm field a worker allocation inherits.
INHERITED_FIELDS: Mapping[str, str] = QUEUE_FIELDS

#: Fields that apply to one submission only and never inherit.
PER_SUBMISSION_FIELDS: tuple[str, ...] = (
    "nodelist", "extra_sbatch_directives", "ray_resources", "ray_start_args", "rejoin_timeout",
)

#: ``ray start`` options a worker allocation's ``ray_start_args`` may set although the
#: launcher sets them too: on these nodes the entry takes precedence.
OVERRIDABLE_RAY_OPTIONS: frozenset[str] = frozenset(
    {"num-cpus", "num-gpus", "object-store-memory", "temp-dir"}
)

#: Resource names Ray defines itself (or the library sets): refused in ``ray_resources``.
RESERVED_RESOURCES: frozenset[str] = frozenset(
    {"CPU", "GPU", "memory", "object_store_memory", WORKER_RESOURCE}
)
_RESERVED_PREFIXES = ("node:", "accelerator_type:")
_RESOURCE_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")


def _worker_ray_reserved(name: str) -> str | None:
    if name in OVERRIDABLE_RAY_OPTIONS:
        return None
    if name == "resources":
        return "--resources is set for worker nodes; use ray_resources (a dict) instead"
    advice = RAY_MANAGED_OPTIONS.get(name)
    return None if advice is None else f"--{name} {advice}"


WORKER_RAY_START_RULES = OptionRules(
    program="ray start",
    reserved=_worker_ray_reserved,
    short_form=lambda entry: (
        "only long-form options are accepted, one per entry, e.g. '--num-cpus=8'"
    ),
    example="--num-cpus=8",
)
"""What a worker allocation's ``ray_start_args`` may hold: the launcher's rules, except
that the options of :data:`OVERRIDABLE_RAY_OPTIONS` are accepted (and win)."""


class SlurmWorkerAllocationConfig(Config, KnownFieldsOnly):
    """A worker allocation: a Slurm job whose nodes join the run's Ray cluster.

    Slurm fields left None inherit the session's first worker allocation or, without one,
    the head allocation (:func:`resolve_worker_config`). ``nodelist``,
    ``extra_sbatch_directives``, ``ray_resources``, ``ray_start_args`` and
    ``rejoin_timeout`` apply to this submission only.
    """

    partition: str | None = Field(default=None, description="Partition; None: inherited.")
    num_nodes: int | None = Field(default=None, description="Nodes (--nodes); None: inherited.")
    cpus_per_task: int | None = Field(
        default=None, description="CPUs per node (--cpus-per-task); None: inherited."
    )
    gpus_per_node: int | None = Field(
        default=None, description="GPUs per node; Ray on these nodes reports as many. None: inherited."
    )
    mem: str | None = Field(
        default=None,
        description="Memory per node (--mem); setting it replaces inherited mem or mem_per_cpu.",
    )
    mem_per_cpu: str | None = Field(
        default=None,
        description="Memory per CPU (--mem-per-cpu); setting it replaces inherited mem or mem_per_cpu.",
    )
    time_limit: str | None = Field(default=None, description="Walltime (--time); None: inherited.")
    time_min: str | None = Field(
        default=None, description="Shortest walltime backfill may shrink to; None: inherited."
    )
    qos: str | None = Field(default=None, description="QOS; None: inherited.")
    account: str | None = Field(default=None, description="Account; None: inherited.")
    reservation: str | None = Field(default=None, description="Reservation; None: inherited.")
    signal_before_timeout: str | None = Field(
        default=None,
        description=(
            "Signal before the walltime, e.g. 'TERM@600': the allocation then drains itself, "
            "ending 15 s before its walltime. None: inherited."
        ),
    )
    nodelist: str | None = Field(
        default=None, description="Nodes to run on (--nodelist), this submission only."
    )
    extra_sbatch_directives: list[str] = Field(
        default_factory=list,
        description="Further sbatch options, one '--option[=value]' per entry; this submission only.",
    )
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "Ray custom resources every node of this allocation offers, e.g. "
            "{'accelerator:a40': 1}; this submission only."
        ),
    )
    ray_start_args: list[str] = Field(
        default_factory=list,
        description=(
            "Further 'ray start' options on these nodes (e.g. '--num-cpus=8'); they take "
            "precedence over the launcher's values. This submission only."
        ),
    )
    rejoin_timeout: float = Field(
        default=DEFAULT_REJOIN_TIMEOUT,
        description=(
            "Seconds the allocation waits for a live head before it releases itself; keep "
            "it above about 5 minutes so that it can still be elected. This submission only."
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

    @field_validator("ray_resources")
    @classmethod
    def _check_resources(cls, value: dict[str, float]) -> dict[str, float]:
        return check_ray_resources(value)

    @field_validator("ray_start_args")
    @classmethod
    def _check_start_args(cls, value: list[str]) -> list[str]:
        return list(validate_option_entries(value, field="ray_start_args",
                                            rules=WORKER_RAY_START_RULES))

    @field_validator("rejoin_timeout")
    @classmethod
    def _check_rejoin(cls, value: float) -> float:
        if isinstance(value, bool) or not (value > 0 and math.isfinite(value)):
            raise ConfigurationError("rejoin_timeout", value,
                                     "must be a positive, finite number of seconds")
        return value

    @model_validator(mode="after")
    def _check_combination(self) -> SlurmWorkerAllocationConfig:
        check_time_combination(self.time_limit, self.time_min, self.signal_before_timeout)
        return self

    def to_queue_config(self) -> SlurmQueueConfig:
        """The Slurm request of a *resolved* configuration (see :func:`resolve_worker_config`),
        as a :class:`SlurmQueueConfig`; a None field means what it means there (left to the
        scheduler). Nothing comes from the queue. Raises :class:`ValueError` when
        ``num_nodes``, ``cpus_per_task``, ``gpus_per_node`` or ``time_limit`` is None
        (the configuration was not resolved)."""
        values: dict[str, Any] = {queue: getattr(self, own) for own, queue in
                                  INHERITED_FIELDS.items()}
        missing = [own for own in ("num_nodes", "cpus_per_task", "gpus_per_node", "time_limit")
                   if getattr(self, own) is None]
        if missing:
            raise ValueError(f"worker allocation not resolved: {', '.join(missing)} is None; "
                             "call resolve_worker_config first")
        values["extra_sbatch_directives"] = list(self.extra_sbatch_directives)
        try:
            return SlurmQueueConfig(**values)
        except ValidationError as error:
            raise in_own_words(error, "SlurmWorkerAllocationConfig",
                                "the first worker allocation or the head") from None

    def to_sbatch_spec(self, job_name: str, script_path: str, **overrides: Any) -> SbatchSpec:
        """The sbatch request of a resolved configuration, with ``nodelist``;
        ``overrides`` (SbatchSpec fields) take precedence."""
        extra: dict[str, Any] = {"nodelist": self.nodelist} if self.nodelist else {}
        return self.to_queue_config().to_sbatch_spec(job_name, script_path,
                                                     **{**extra, **overrides})

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able copy, recorded in the session document with the worker allocation."""
        return self.model_dump(mode="json")


def check_ray_resources(value: Mapping[str, Any], field: str = "ray_resources") -> dict[str, float]:
    """``value`` as Ray custom resources, checked: names of 1-128 characters of
    ``A-Z a-z 0-9 _ . : / -``, none of Ray's own (``CPU``, ``GPU``, ``memory``, ``node:...``)
    or the library's (``dagster_slurm_worker``), quantities positive and finite."""
    checked: dict[str, float] = {}
    for name, amount in value.items():
        where = f"{field}[{name!r}]"
        if not isinstance(name, str) or _RESOURCE_NAME.fullmatch(name) is None:
            raise ConfigurationError(
                field, dict(value),
                f"resource name {name!r} must be 1-128 characters of letters, digits and "
                "_ . : / -, such as 'accelerator:a40'",
            )
        if name in RESERVED_RESOURCES or name.startswith(_RESERVED_PREFIXES):
            raise ConfigurationError(
                where, amount,
                f"{name!r} is a resource Ray or the library sets on every node; choose "
                "another name (gpus_per_node and ray_start_args set CPUs, GPUs and memory)",
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not (
                amount > 0 and math.isfinite(amount)):
            raise ConfigurationError(where, amount, "must be a positive, finite number")
        checked[name] = float(amount)
    return checked


def _source_values(first_worker: SlurmWorkerAllocationConfig | None,
                   head: SlurmQueueConfig) -> dict[str, Any]:
    if first_worker is not None:
        return {own: getattr(first_worker, own) for own in INHERITED_FIELDS}
    return {own: getattr(head, queue) for own, queue in INHERITED_FIELDS.items()}


def resolve_worker_config(
    config: SlurmWorkerAllocationConfig,
    first_worker: SlurmWorkerAllocationConfig | None,
    head: SlurmQueueConfig,
) -> SlurmWorkerAllocationConfig:
    """``config`` with every Slurm field it leaves None taken from its source.

    The source is ``first_worker`` (the session's first worker allocation, as resolved
    itself: what the session recorded), or ``head`` (the head allocation's effective
    request, e.g. ``run_allocation.queue_for(queue)`` or :func:`head_queue_config`) when the
    session has no worker allocation yet. The source's values are taken as they are, None
    included. ``mem`` and ``mem_per_cpu`` form one setting: when ``config`` sets either, the
    source's memory is not used. The fields of :data:`PER_SUBMISSION_FIELDS` stay
    ``config``'s. A combination that does not hold (an inherited ``time_min`` above this
    allocation's ``time_limit``, say) raises :class:`ConfigurationError` naming the field
    and where its value came from.
    """
    source = _source_values(first_worker, head)
    origin = "the first worker allocation" if first_worker is not None else "the head allocation"
    values = config.model_dump()
    inherited: list[str] = []
    own_memory = config.mem is not None or config.mem_per_cpu is not None
    for own in INHERITED_FIELDS:
        if own in ("mem", "mem_per_cpu") and own_memory:
            continue
        if values[own] is None and source[own] is not None:
            values[own] = source[own]
            inherited.append(own)
    try:
        check_time_combination(values["time_limit"], values["time_min"],
                               values["signal_before_timeout"])
    except ConfigurationError as error:
        came = [name for name in ("time_limit", "time_min", "signal_before_timeout")
                if name in inherited]
        note = (f" ({', '.join(came)} inherited from {origin}; set "
                f"{' and '.join(came)} on this worker allocation)") if came else ""
        raise ConfigurationError(error.field, error.value, error.problem + note) from None
    return SlurmWorkerAllocationConfig(**values)


def first_worker_config(run_allocation: SlurmRunAllocationConfig,
                        queue: SlurmQueueConfig) -> SlurmWorkerAllocationConfig:
    """The run's first worker allocation when ``run_allocation`` becomes one (a separate
    head is set): its fields as given, the rest from the queue, as for the run allocation
    itself (``run_allocation.queue_for(queue)``), resolved, with its ``nodelist``."""
    request = run_allocation.queue_for(queue)
    values = {own: getattr(request, queue_field) for own, queue_field in INHERITED_FIELDS.items()}
    return SlurmWorkerAllocationConfig(
        **values, extra_sbatch_directives=list(run_allocation.extra_sbatch_directives),
        nodelist=run_allocation.nodelist)


# -- a separate head ----------------------------------------------------------------------------
#: The head's shape where its configuration leaves it None: one node, 2 CPUs, 8 GB, no GPUs.
HEAD_DEFAULTS: Mapping[str, Any] = {"num_nodes": 1, "cpus": 2, "mem": "8G", "gpus_per_node": 0}

#: Fields a separate head takes from the queue when it leaves them None.
HEAD_QUEUE_FIELDS: tuple[str, ...] = ("account", "qos", "reservation")


def check_head_allocation(config: SlurmRunAllocationConfig,
                          field: str = "ray_head_allocation") -> SlurmRunAllocationConfig:
    """``config`` if it can host a separate head: ``partition`` and ``time_limit`` must be
    set, since the queue's values describe compute jobs. Raises
    :class:`ConfigurationError` naming ``<field>.partition`` or ``<field>.time_limit``."""
    if config.partition is None:
        raise ConfigurationError(
            f"{field}.partition", None,
            "a separate head allocation needs an explicit partition, usually a CPU partition "
            "(the queue's partition describes compute jobs); '' uses the cluster's default",
        )
    if config.time_limit is None:
        raise ConfigurationError(
            f"{field}.time_limit", None,
            "a separate head allocation needs an explicit time_limit covering the whole run, "
            "such as the partition's maximum",
        )
    return config


def head_queue_config(queue: SlurmQueueConfig, head: SlurmRunAllocationConfig,
                      field: str = "ray_head_allocation") -> SlurmQueueConfig:
    """The request of a separate head: ``head``'s fields; where it leaves them None, one
    node, 2 CPUs, 8 GB and no GPUs (:data:`HEAD_DEFAULTS`) and the queue's account, QoS and
    reservation; no other queue value (not its time_min, signal or directives). Checks
    ``head`` with :func:`check_head_allocation` first."""
    check_head_allocation(head, field)
    values: dict[str, Any] = {
        "partition": head.partition or None,
        "time_limit": head.time_limit,
        "time_min": head.time_min,
        "signal_before_timeout": head.signal_before_timeout,
        "num_nodes": head.num_nodes if head.num_nodes is not None else HEAD_DEFAULTS["num_nodes"],
        "cpus": head.cpus_per_task if head.cpus_per_task is not None else HEAD_DEFAULTS["cpus"],
        "gpus_per_node": (head.gpus_per_node if head.gpus_per_node is not None
                          else HEAD_DEFAULTS["gpus_per_node"]),
        "mem": head.mem,
        "mem_per_cpu": head.mem_per_cpu,
        "extra_sbatch_directives": list(head.extra_sbatch_directives),
    }
    if head.mem is None and head.mem_per_cpu is None:
        values["mem"] = HEAD_DEFAULTS["mem"]
    elif head.mem_per_cpu is not None:
        values["mem"] = None
    for name in HEAD_QUEUE_FIELDS:
        own = getattr(head, name)
        values[name] = own if own is not None else getattr(queue, name)
    try:
        return SlurmQueueConfig(**values)
    except ValidationError as error:
        raise in_own_words(error, "SlurmRunAllocationConfig",
                            "the head defaults and the queue's account, QoS and "
                            "reservation") from None
