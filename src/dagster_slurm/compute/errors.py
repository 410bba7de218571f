"""Typed failures of a job.

Kept under this import path for existing code; defined in :mod:`dagster_slurm.jobs.errors`.
"""

from dagster_slurm.jobs.errors import (
    JobOutcome,
    SlurmJobCancelled,
    SlurmJobError,
    SlurmJobLost,
    SlurmJobNonZeroExit,
    SlurmJobOutOfMemory,
    SlurmJobPreempted,
    SlurmJobTimeout,
    SlurmJobUnschedulable,
    SlurmNodeFailure,
    SlurmSubmissionError,
)

__all__ = [
    "JobOutcome",
    "SlurmJobCancelled",
    "SlurmJobError",
    "SlurmJobLost",
    "SlurmJobNonZeroExit",
    "SlurmJobOutOfMemory",
    "SlurmJobPreempted",
    "SlurmJobTimeout",
    "SlurmJobUnschedulable",
    "SlurmNodeFailure",
    "SlurmSubmissionError",
]
