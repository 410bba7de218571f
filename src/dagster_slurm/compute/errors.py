"""Temporary import path of :class:`~dagster_slurm.jobs.errors.SlurmJobError`.

Not a published path (the published 1.x package had no ``dagster_slurm.compute``): kept only
because ``tests/unit/session/test_session_errors.py`` still imports it from here. Delete this
module once that test imports :mod:`dagster_slurm.jobs.errors`. Everything else imports the
job errors from :mod:`dagster_slurm.jobs.errors` (or the package root).
"""

from dagster_slurm.jobs.errors import SlurmJobError

__all__ = ["SlurmJobError"]
