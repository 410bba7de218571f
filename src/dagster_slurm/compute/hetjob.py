"""The components of :meth:`ComputeResource.run_hetjob` (experimental): checked, then turned
into the scheduler overrides of one heterogeneous Slurm job.

Component 0 takes the fields of the job itself (it runs the batch script and the payload);
components 1, 2, ... become :class:`~dagster_slurm.slurm.hetjob.HetComponentSpec` entries.
Every error names the component as the caller wrote it, ``components[1].partition``, and
is raised before anything is submitted or started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import Config
from pydantic import Field, ValidationError, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.hetjob import HetComponentSpec

#: Fewest components of a heterogeneous job (one component is an ordinary job: use run()).
MIN_COMPONENTS = 2

#: Host name the component variables give in local mode.
LOCAL_HOST = "localhost"

#: Spec field -> component field, for error messages in the caller's words.
_FIELD_OF_SPEC = {"num_nodes": "nodes"}


class HetJobComponent(Config, KnownFieldsOnly):
    """The resources of one component of a heterogeneous job (experimental).

    Fields left as None are not requested: the partition's defaults apply, except that a
    component without ``partition`` gets the partition of the component before it (Slurm
    carries it over); component 0 without one gets the Slurm resource's queue partition.
    """

    partition: str | None = Field(
        default=None,
        description="Partition of this component; None: see the class description.",
    )
    nodes: int = Field(default=1, description="Nodes of this component (--nodes), at least 1.")
    cpus_per_task: int | None = Field(
        default=None, description="CPUs per task (--cpus-per-task); None: the partition's default."
    )
    mem: str | None = Field(
        default=None, description="Memory per node (--mem), e.g. '4G'; None: the partition's default."
    )
    gpus_per_node: int = Field(
        default=0, description="GPUs per node (--gpus-per-node); 0 asks for none."
    )

    @model_validator(mode="after")
    def _check_values(self) -> HetJobComponent:
        try:
            self.to_spec()
        except ConfigurationError as error:
            raise ConfigurationError(
                _FIELD_OF_SPEC.get(error.field, error.field), error.value, error.problem
            ) from None
        return self

    def to_spec(self) -> HetComponentSpec:
        """This component as a validated :class:`HetComponentSpec`."""
        if self.gpus_per_node < 0:
            raise ConfigurationError("gpus_per_node", self.gpus_per_node, "must be 0 or more")
        return HetComponentSpec(
            partition=self.partition, num_nodes=self.nodes, cpus_per_task=self.cpus_per_task,
            mem=self.mem, gpus_per_node=self.gpus_per_node or None,
        )


def _first_problem(error: ValidationError) -> tuple[str, object, str]:
    """``(field, value, problem)`` of the first error pydantic collected."""
    first = error.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigurationError):
        return cause.field, cause.value, cause.problem
    where = ".".join(str(part) for part in first.get("loc", ()))
    return where, first.get("input"), first.get("msg", "is invalid")


def check_component(index: int, value: object) -> HetJobComponent:
    """``value`` (a :class:`HetJobComponent` or a mapping of its fields) as a component;
    a :class:`ConfigurationError` names ``components[<index>].<field>``."""
    where = f"components[{index}]"
    if isinstance(value, HetJobComponent):
        return value
    if not isinstance(value, Mapping):
        raise ConfigurationError(where, value, "must be a HetJobComponent or a mapping of its fields")
    try:
        return HetJobComponent(**value)
    except ConfigurationError as error:
        raise ConfigurationError(f"{where}.{error.field}", error.value, error.problem) from None
    except ValidationError as error:
        field, bad, problem = _first_problem(error)
        raise ConfigurationError(f"{where}.{field}", bad, problem) from None


def check_components(components: object) -> tuple[HetJobComponent, ...]:
    """Every component checked (see :func:`check_component`); at least
    :data:`MIN_COMPONENTS` of them, in a list or tuple."""
    if isinstance(components, (str, bytes, Mapping)) or not isinstance(components, Sequence):
        raise ConfigurationError("components", components, "must be a list of HetJobComponent")
    if len(components) < MIN_COMPONENTS:
        raise ConfigurationError(
            "components", components,
            f"a heterogeneous job needs at least {MIN_COMPONENTS} components; "
            "for one, call run() with extra_slurm_opts",
        )
    return tuple(check_component(index, value) for index, value in enumerate(components))


def het_overrides(components: Sequence[HetJobComponent]) -> dict[str, Any]:
    """The scheduler overrides (:class:`~dagster_slurm.slurm.commands.SbatchSpec` field
    names) of the job: component 0's resources, the others as ``het_components``. A field
    component 0 leaves as None keeps the queue's value."""
    first = components[0]
    overrides: dict[str, Any] = {"num_nodes": first.nodes}
    for name in ("partition", "cpus_per_task", "mem"):
        if getattr(first, name) is not None:
            overrides[name] = getattr(first, name)
    overrides["gpus_per_node"] = first.gpus_per_node or None
    overrides["het_components"] = tuple(component.to_spec() for component in components[1:])
    return overrides


def local_component_env(components: Sequence[HetJobComponent]) -> dict[str, str]:
    """The component variables a local run gives the payload: Slurm's names, every
    component on this host (one node each)."""
    env = {"SLURM_HET_SIZE": str(len(components))}
    for index in range(len(components)):
        env[f"SLURM_JOB_NODELIST_HET_GROUP_{index}"] = LOCAL_HOST
        env[f"SLURM_JOB_NUM_NODES_HET_GROUP_{index}"] = "1"
    return env
