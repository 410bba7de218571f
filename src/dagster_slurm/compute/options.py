"""Per-call arguments of ``ComputeResource.run`` checked before anything starts.

``extra_slurm_opts``: per-asset overrides of the queue settings; ``extras``: values handed
to the payload through Dagster Pipes, which must survive JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dagster_slurm.config_errors import unknown_name_problem
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.exec_limits import check_argument

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

    Values are checked here, alone and together (before anything is sent), and again
    with the queue's values when the SbatchSpec is built; an error names the key as given
    (``extra_slurm_opts['cpus']``, not ``cpus_per_task``). A key given twice under two
    spellings (``nodes`` and ``num_nodes``) is an error.
    """
    overrides: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for key, value in (extra_slurm_opts or {}).items():
        target = OPTION_FIELDS.get(key)
        if target is None:
            raise ConfigurationError(
                f"extra_slurm_opts[{key!r}]", value,
                unknown_name_problem(str(key), OPTION_FIELDS, what="option"),
            )
        if target in overrides:
            raise ConfigurationError(
                f"extra_slurm_opts[{key!r}]", value, f"{target} is already set by another key"
            )
        if target == "extra_directives":
            value = tuple(value)
        for entry in value if target == "extra_directives" else (value,):
            if isinstance(entry, str):  # each reaches sbatch as (part of) one argument
                check_argument(f"extra_slurm_opts[{key!r}]", entry)
        if target == "gpus_per_node" and value == 0:
            value = None
        overrides[target] = value
        keys[target] = key
    _check_values(overrides, keys)
    return overrides


def _check_values(overrides: Mapping[str, Any], keys: Mapping[str, str]) -> None:
    """Build an SbatchSpec of ``overrides`` alone; re-raise its error under the user's key."""
    try:
        SbatchSpec(job_name="option-check", script_path="/dev/null", **overrides)
    except ConfigurationError as error:
        base, bracket, rest = error.field.partition("[")
        if base not in keys:
            raise
        raise ConfigurationError(
            f"extra_slurm_opts[{keys[base]!r}]{bracket}{rest}", error.value, error.problem
        ) from None


def validate_extras(extras: Mapping[str, Any] | None) -> None:
    """Raise :class:`ConfigurationError` unless ``extras`` is None or a mapping with string
    keys whose values JSON can carry to the payload (strings, numbers, booleans, None,
    lists and dicts of them). The error names ``extras[<key>]`` and the value."""
    if extras is None:
        return
    if not isinstance(extras, Mapping):
        raise ConfigurationError("extras", extras, "must be a mapping of names to JSON values")
    for key, value in extras.items():
        if not isinstance(key, str):
            raise ConfigurationError(
                "extras", key, f"keys must be strings, got {type(key).__name__} {key!r}"
            )
        try:
            json.dumps(value)
        except (TypeError, ValueError) as error:
            raise ConfigurationError(
                f"extras[{key!r}]", value,
                f"is not JSON-serialisable ({error}); the payload receives extras as JSON, so "
                "pass strings, numbers, booleans, None, lists or dicts (convert other values "
                "first, e.g. str(path))",
            ) from None
