"""``extra_slurm_opts``: per-asset overrides of the queue settings, checked before submission."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster_slurm.errors import ConfigurationError

#: Keys users write -> SbatchSpec field. Several spellings of the reference library are accepted.
OPTION_FIELDS: Mapping[str, str] = {
    "nodes": "num_nodes",
    "num_nodes": "num_nodes",
    "ntasks": "ntasks",
    "ntasks_per_node": "ntasks_per_node",
    "cpus_per_task": "cpus_per_task",
    "cpus": "cpus_per_task",
    "mem": "mem",
    "mem_per_cpu": "mem_per_cpu",
    "gpus_per_node": "gpus_per_node",
    "gres": "gres",
    "time_limit": "time_limit",
    "time": "time_limit",
    "time_min": "time_min",
    "partition": "partition",
    "qos": "qos",
    "account": "account",
    "reservation": "reservation",
    "nodelist": "nodelist",
    "exclusive": "exclusive",
    "extra_sbatch_directives": "extra_directives",
}


def sbatch_overrides(extra_slurm_opts: Mapping[str, Any] | None) -> dict[str, Any]:
    """SbatchSpec overrides for ``extra_slurm_opts``; an unknown key raises naming it.

    Values are checked when the SbatchSpec is built (before anything is sent); a key given
    twice under two spellings (``nodes`` and ``num_nodes``) is an error.
    """
    overrides: dict[str, Any] = {}
    for key, value in (extra_slurm_opts or {}).items():
        target = OPTION_FIELDS.get(key)
        if target is None:
            raise ConfigurationError(
                f"extra_slurm_opts[{key!r}]",
                value,
                "unknown option; use one of " + ", ".join(sorted(OPTION_FIELDS)),
            )
        if target in overrides:
            raise ConfigurationError(
                f"extra_slurm_opts[{key!r}]", value, f"{target} is already set by another key"
            )
        if target == "extra_directives":
            value = tuple(value)
        if target == "gpus_per_node" and value == 0:
            value = None
        overrides[target] = value
    return overrides
