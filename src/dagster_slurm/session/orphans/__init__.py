"""Orphaned Slurm work of Dagster runs that are over: run sessions and asset-scope jobs,
found and judged for the orphan sensor.
"""
