"""dagster-slurm: run Dagster assets on Slurm clusters over SSH with Dagster Pipes."""

from __future__ import annotations

__version__ = "0.1.0"
