"""Example Dagster project for dagster-slurm (see examples/README.md)."""

from dagster_slurm_example.definitions import defs

__all__ = ["defs"]
