"""Which activation script a Slurm payload sources.

Kept under this import path for existing code; defined in :mod:`dagster_slurm.jobs.activation`.
"""

from dagster_slurm.jobs.activation import (
    activation_for,
)

__all__ = [
    "activation_for",
]
