"""Errors of the environment layer."""

from __future__ import annotations

from dagster_slurm.errors import DagsterSlurmError


class EnvironmentSetupError(DagsterSlurmError):
    """Packing, uploading or installing the payload's Python environment failed.

    The message names the step and carries the tail of the failing tool's output.
    """
