"""What the orphan reconciliation asks of the Dagster instance about one run (pure helpers).

A run the instance cannot be read for raises :class:`Unknown`: its Slurm jobs are kept, and
the next reconciliation (or the jobs' own dead-man's switch) decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Run statuses of a run that may still have a live supervising process.
UNFINISHED = frozenset({"STARTED", "STARTING", "CANCELING", "NOT_STARTED", "QUEUED"})
#: Run statuses after which no Slurm job of the run has any use.
FINISHED = frozenset({"SUCCESS", "FAILURE", "CANCELED"})


class Unknown(Exception):
    """The instance could not say what a run is doing; ``args[0]`` says why."""


def quiet_for(instance: Any, run_id: str, clock: Callable[[], float] = time.time) -> float | None:
    """Seconds since the run's last event in the instance (None when it has none).

    Raises :class:`Unknown` when the events cannot be read: a run whose activity is
    unknown is never judged quiet.
    """
    try:
        records = instance.get_records_for_run(run_id, ascending=False, limit=1).records
    except Exception as exc:  # noqa: BLE001 - turned into Unknown, which keeps the jobs
        raise Unknown(f"its events could not be read ({type(exc).__name__}: {exc})") from exc
    if not records:
        return None
    return max(0.0, clock() - records[0].event_log_entry.timestamp)


def run_of(instance: Any, run_id: str) -> Any:
    """The instance's run ``run_id`` (None when the instance does not know it); raises
    :class:`Unknown` when the instance cannot be read."""
    try:
        return instance.get_run_by_id(run_id)
    except Exception as exc:  # noqa: BLE001 - turned into Unknown, which keeps the jobs
        raise Unknown(f"the run could not be read ({type(exc).__name__}: {exc})") from exc


def status_of(run: Any) -> str:
    """The run's status as its name (``STARTED``, ``FAILURE``)."""
    return str(getattr(run.status, "value", run.status))
