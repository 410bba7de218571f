"""The scheduler layer: typed Slurm command builders and output parsers, without I/O.

Commands are built as argv lists (:mod:`~dagster_slurm.slurm.commands`) and quoted once by
the transport; scheduler output is read into frozen records
(:mod:`~dagster_slurm.slurm.parsers`, :mod:`~dagster_slurm.slurm.accounting`) whose
unreadable fields are None. Job states are the :class:`JobState` enum.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dagster_slurm.slurm.accounting import SacctRecord, SacctStep, parse_sacct
from dagster_slurm.slurm.commands import (
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    SQUEUE_FORMAT,
    SbatchSpec,
    sacct_argv,
    sacct_base_argv,
    sacct_fields,
    sbatch_argv,
    scancel_argv,
    scontrol_show_config_argv,
    scontrol_update_timelimit_argv,
    squeue_argv,
    squeue_state_argv,
    squeue_user_argv,
)
from dagster_slurm.slurm.directives import (
    FORBIDDEN_SBATCH_OPTIONS,
    MANAGED_SBATCH_OPTIONS,
    validate_extra_sbatch_directives,
)
from dagster_slurm.slurm.hostlist import expand_hostlist
from dagster_slurm.slurm.parsers import (
    SqueueRecord,
    TestOnlyResult,
    min_job_age_seconds,
    parse_sbatch_parsable,
    parse_scontrol_config,
    parse_squeue,
    parse_test_only,
)
from dagster_slurm.slurm.states import (
    ACTIVE_STATES,
    FAILURE_STATES,
    PENDING_STATES,
    TERMINAL_STATES,
    JobState,
)
from dagster_slurm.slurm.units import parse_size_bytes
from dagster_slurm.slurm.validation import (
    validate_job_name,
    validate_slurm_name,
)
from dagster_slurm.slurm.version import SlurmFeature, SlurmVersion, parse_slurm_version
from dagster_slurm.slurm.walltime import format_walltime, parse_duration, validate_walltime

__all__ = [
    "ACTIVE_STATES",
    "FAILURE_STATES",
    "FORBIDDEN_SBATCH_OPTIONS",
    "MANAGED_SBATCH_OPTIONS",
    "PENDING_STATES",
    "SACCT_FIELDS",
    "SQUEUE_FIELDS",
    "SQUEUE_FORMAT",
    "TERMINAL_STATES",
    "JobState",
    "SacctRecord",
    "SacctStep",
    "SbatchSpec",
    "SlurmFeature",
    "SlurmQueueConfig",
    "SlurmVersion",
    "SqueueRecord",
    "TestOnlyResult",
    "expand_hostlist",
    "format_walltime",
    "min_job_age_seconds",
    "parse_duration",
    "parse_sacct",
    "parse_sbatch_parsable",
    "parse_scontrol_config",
    "parse_size_bytes",
    "parse_slurm_version",
    "parse_squeue",
    "parse_test_only",
    "sacct_argv",
    "sacct_base_argv",
    "sacct_fields",
    "sbatch_argv",
    "scancel_argv",
    "scontrol_show_config_argv",
    "scontrol_update_timelimit_argv",
    "squeue_argv",
    "squeue_state_argv",
    "squeue_user_argv",
    "validate_extra_sbatch_directives",
    "validate_job_name",
    "validate_slurm_name",
    "validate_walltime",
]

if TYPE_CHECKING:
    from dagster_slurm.slurm.queue import SlurmQueueConfig


def __getattr__(name: str) -> Any:
    # SlurmQueueConfig is a Dagster Config, imported on first use: the rest of this layer
    # (and the agent client, which reads Slurm versions) does not need Dagster.
    if name != "SlurmQueueConfig":
        raise AttributeError(f"module 'dagster_slurm.slurm' has no attribute {name!r}")
    value = getattr(importlib.import_module("dagster_slurm.slurm.queue"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"SlurmQueueConfig"})
