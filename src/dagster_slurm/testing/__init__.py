"""Test support for dagster-slurm and its users.

:mod:`dagster_slurm.testing.plugin` is a pytest plugin (loaded automatically) with the
``slurm_cluster`` and ``slurm_env`` fixtures backed by the development Slurm cluster.
"""
