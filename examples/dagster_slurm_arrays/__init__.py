"""Array example: one asset over 200 partitions, run as Slurm job arrays (see docs/arrays.md)."""

from dagster_slurm_arrays.definitions import defs

__all__ = ["defs"]
