"""Job figures that become materialization metadata.

Kept under this import path for existing code; defined in :mod:`dagster_slurm.jobs.metrics`.
"""

from dagster_slurm.jobs.metrics import (
    METADATA_KEYS,
    JobMetrics,
    from_local,
    from_sacct,
    from_step,
)

__all__ = [
    "JobMetrics",
    "METADATA_KEYS",
    "from_local",
    "from_sacct",
    "from_step",
]
