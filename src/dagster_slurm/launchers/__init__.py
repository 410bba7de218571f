"""Launchers: pure code that turns a payload and its environment into a job script.

:class:`ExecutionPlan` describes what to run; a :class:`ComputeLauncher` (by default
:class:`BashLauncher`) renders the script text from templates in package data;
:func:`payload_argv` decides whether a user's ``payload_path`` is a script to upload or a
command to run.
"""

from dagster_slurm.launchers.base import (
    CANCEL_SIGNALS,
    DEFAULT_DRAIN_SIGNAL,
    DRAIN_SIGNALS,
    ComputeLauncher,
    ExecutionMode,
    ExecutionPlan,
    PayloadSpec,
    is_shell_script,
    normalize_drain_signal,
    payload_argv,
    validate_env,
)
from dagster_slurm.launchers.bash import BashLauncher, resolve_launcher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.ray_ports import RayPortConfig
from dagster_slurm.launchers.spark import SparkLauncher

__all__ = [
    "CANCEL_SIGNALS",
    "DEFAULT_DRAIN_SIGNAL",
    "DRAIN_SIGNALS",
    "BashLauncher",
    "ComputeLauncher",
    "ExecutionMode",
    "ExecutionPlan",
    "RayLauncher",
    "RayPortConfig",
    "PayloadSpec",
    "SparkLauncher",
    "is_shell_script",
    "normalize_drain_signal",
    "payload_argv",
    "resolve_launcher",
    "validate_env",
]
