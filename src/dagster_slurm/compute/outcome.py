"""From a finished job's final state and exit code to success or a typed error.

Kept under this import path for existing code; defined in :mod:`dagster_slurm.jobs.outcome`.
"""

from dagster_slurm.jobs.outcome import (
    outcome_error,
)

__all__ = [
    "outcome_error",
]
