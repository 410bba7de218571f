"""Temporary import path of :class:`~dagster_slurm.jobs.paths.InvocationPaths`.

Not a published path (the published 1.x package had no ``dagster_slurm.compute``): kept only
because ``tests/unit/session/test_session_server.py`` still imports it from here. Delete this
module once that test imports :mod:`dagster_slurm.jobs.paths`. Everything else imports it
from :mod:`dagster_slurm.jobs.paths`.
"""

from dagster_slurm.jobs.paths import InvocationPaths

__all__ = ["InvocationPaths"]
