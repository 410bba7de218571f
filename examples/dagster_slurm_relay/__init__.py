"""Relay example: one asset carried over several Slurm allocations (see docs/relay.md)."""

from dagster_slurm_relay.definitions import defs

__all__ = ["defs"]
