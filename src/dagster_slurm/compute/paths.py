"""Where the files of one invocation live, and the job name it gets.

Kept under this import path for existing code; defined in :mod:`dagster_slurm.jobs.paths`.
"""

from dagster_slurm.jobs.paths import (
    InvocationPaths,
    job_name_for,
    safe_name,
    step_identity,
)

__all__ = [
    "InvocationPaths",
    "job_name_for",
    "safe_name",
    "step_identity",
]
