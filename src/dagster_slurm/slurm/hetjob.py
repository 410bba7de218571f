"""The further components of a Slurm heterogeneous job, as ``sbatch`` options.

A heterogeneous job is one submission whose parts (components) each ask for their own
resources: a CPU partition for one, a GPU partition for another. ``sbatch`` takes the
components' options on one command line, separated by a lone ``:`` argument; the options
before the first ``:`` belong to component 0 and to the job as a whole (name, output files,
comment, time limit, signal), and Slurm carries some of them (``--partition``,
``--job-name``, ``--comment``, ``--account``, ``--qos``, ...) over to the later components
unless a component sets its own. The batch script runs once, on the first node of
component 0; ``srun --het-group=<n>`` starts a step on component ``n``.

:class:`HetComponentSpec` is one later component (1, 2, ...), validated on construction like
:class:`~dagster_slurm.slurm.commands.SbatchSpec`; :func:`het_component_argv` gives its
options, sorted by name. Component 0 is the :class:`~dagster_slurm.slurm.commands.SbatchSpec`
itself, whose ``het_components`` field holds the rest. Nothing here runs or quotes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dagster_slurm.slurm.validation import validate_count, validate_memory, validate_slurm_name

HET_SEPARATOR = ":"
"""The ``sbatch`` argument that separates one component's options from the next one's."""

_OPTION_OF_FIELD: dict[str, str] = {
    "partition": "partition",
    "num_nodes": "nodes",
    "cpus_per_task": "cpus-per-task",
    "mem": "mem",
    "gpus_per_node": "gpus-per-node",
}


@dataclass(frozen=True)
class HetComponentSpec:
    """The resources of one later component (offset 1, 2, ...) of a heterogeneous job.

    A field left as None is not passed: Slurm's default for a component applies (for
    ``partition``: the partition of the component before, which Slurm carries over; for
    the others: the partition's defaults). Values are validated on construction; an invalid
    one raises :class:`~dagster_slurm.errors.ConfigurationError` naming the field.
    """

    partition: str | None = None
    """``--partition`` of this component."""
    num_nodes: int | None = None
    """``--nodes``: nodes of this component."""
    cpus_per_task: int | None = None
    """``--cpus-per-task`` of this component."""
    mem: str | None = None
    """``--mem``: memory per node of this component, e.g. ``4G``."""
    gpus_per_node: int | None = None
    """``--gpus-per-node`` of this component."""

    def __post_init__(self) -> None:
        if self.partition is not None:
            validate_slurm_name("partition", self.partition)
        for name in ("num_nodes", "cpus_per_task", "gpus_per_node"):
            value = getattr(self, name)
            if value is not None:
                validate_count(name, value)
        if self.mem is not None:
            validate_memory("mem", self.mem)


def het_component_argv(component: HetComponentSpec) -> list[str]:
    """The ``sbatch`` options of one later component, ``--name=value``, sorted by name."""
    options = {
        _OPTION_OF_FIELD[spec_field.name]: f"--{_OPTION_OF_FIELD[spec_field.name]}={value}"
        for spec_field in fields(component)
        if (value := getattr(component, spec_field.name)) is not None
    }
    return [options[name] for name in sorted(options)]
