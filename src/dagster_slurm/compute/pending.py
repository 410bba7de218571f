"""What a pending job is waiting for.

Kept under this import path for existing code; defined in :mod:`dagster_slurm.jobs.pending`.
"""

from dagster_slurm.jobs.pending import (
    DEFAULT_FATAL_REASONS,
    PendingPolicy,
    PendingReport,
    PendingTracker,
    explain_pending,
)

__all__ = [
    "DEFAULT_FATAL_REASONS",
    "PendingPolicy",
    "PendingReport",
    "PendingTracker",
    "explain_pending",
]
