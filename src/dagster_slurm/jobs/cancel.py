"""Cancelling a job so that it does not outlive the step that started it.

Both take a plain logger-like object ``out`` (``info``, ``warning``, ``error``; such as a
Dagster ``context.log`` or :class:`~dagster_slurm.jobs.logs.ProgressLog`). Neither raises:
they run while another error propagates, and that error matters more; a failure is logged
with the command that cancels by hand.
"""

from __future__ import annotations

import logging
from typing import Any

from dagster_slurm.scheduler.client import SlurmScheduler

#: The logger the user guide names for failed cancellations (docs/modes.md).
log = logging.getLogger("dagster_slurm.compute")


def keep_after_lost_login(out: Any, what: str) -> None:
    """Log that ``what`` (``job 123``, ``step 123.4``) is left as it is because the login to
    the cluster needs a person: without a login the library cannot see or change it, and a
    lost login is no reason to cancel work. The run's teardown (or the orphan sensor, once
    the run has ended) decides after the next ``dagster-slurm login``."""
    message = (f"{what} is left as it is: the login to the cluster needs a person (see the "
               "error), so its state is unknown here. After the next dagster-slurm login the "
               "run's teardown or the orphan sensor ends it if nothing uses it")
    log.warning(message)
    if out is not None:
        out.warning(message)


def cancel_quietly(scheduler: SlurmScheduler, job_id: str, out: Any) -> None:
    """``scancel job_id``; logs a warning when done, an error (with the command to run by
    hand, also to this module's logger) when the scheduler cannot be asked."""
    try:
        scheduler.cancel([job_id])
        out.warning(f"Cancelled Slurm job {job_id}")
    except Exception as exc:  # noqa: BLE001 - the original error matters more
        message = f"could not cancel Slurm job {job_id}: {exc}; cancel it with `scancel {job_id}`"
        log.error(message)
        out.error(message)


def cancel_by_token(scheduler: SlurmScheduler, job_name: str, token: str, out: Any) -> None:
    """Cancel the active job named ``job_name`` whose comment is ``token``: the job of a
    submission that was interrupted before its job id was known (there may be none). When
    squeue cannot be asked, logs how to look for the job instead."""
    try:
        snapshot = scheduler.status([job_name])
    except Exception as exc:  # noqa: BLE001 - the original error matters more
        out.error(
            f"could not check whether the interrupted submission of {job_name} created a job "
            f"({exc}); look for comment {token} with `squeue --name={job_name} -o '%i %k'`"
        )
        return
    for job_id, record in snapshot.queue.items():
        if record.comment == token and record.state.active:
            cancel_quietly(scheduler, job_id, out)
