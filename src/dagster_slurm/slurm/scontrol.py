"""``scontrol`` argv builders: the cluster's configuration and a job's time limit (pure;
see :mod:`dagster_slurm.slurm.commands` for the conventions)."""

from __future__ import annotations

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.validation import validate_job_id
from dagster_slurm.slurm.version import SlurmVersion
from dagster_slurm.slurm.walltime import format_walltime, validate_walltime

__all__ = ["scontrol_show_config_argv", "scontrol_update_timelimit_argv"]


def scontrol_show_config_argv(*, version: SlurmVersion | None = None) -> list[str]:
    """``scontrol show config`` argv (every release); parse with
    :func:`~dagster_slurm.slurm.parsers.parse_scontrol_config`."""
    del version
    return ["scontrol", "show", "config"]


def scontrol_update_timelimit_argv(
    job_id: str | int, value: str | float, *, version: SlurmVersion | None = None
) -> list[str]:
    """``scontrol update`` argv setting a job's time limit.

    ``value`` is a Slurm duration (``01:00:00``, ``UNLIMITED``), the same prefixed with
    ``+``/``-`` to extend or shorten the current limit, or a number of seconds (written as
    ``[D-]HH:MM:SS``; Slurm rounds up to whole minutes).
    """
    del version  # the same on every release
    job = validate_job_id("job_id", job_id)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value > 0:
            raise ConfigurationError("value", value, "must be a positive number of seconds")
        limit = format_walltime(value)
    elif isinstance(value, str) and value[:1] in ("+", "-"):
        if value[1:].strip().upper() in ("UNLIMITED", "INFINITE"):
            raise ConfigurationError("value", value, "a relative change must be a duration")
        limit = value[0] + validate_walltime("value", value[1:])
    else:
        limit = validate_walltime("value", value)
    return ["scontrol", "update", f"JobId={job}", f"TimeLimit={limit}"]
