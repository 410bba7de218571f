"""A waiting step follows its own Dagster run: when the run is over, the step stops waiting.

A step waits on Slurm for a long time (submission, queue, payload, drain). Its run can end
meanwhile without the step being told: the run worker was SIGKILLed and Dagster's run
monitoring marked the run FAILURE, or an operator terminated it while the step process was
not reachable. A step process that outlived its run must not keep a job running, nor report
a materialization into a run that has failed. So every wait loop calls
:meth:`RunFollower.check` between polls: a cheap read of the run's status from the local
Dagster instance, at most every ``interval`` seconds, that raises :class:`DagsterRunEnded`
once the run is no longer running. The runner's ``_terminate`` then cancels the step's job
(asset scope) or its job step (run scope), the Pipes session reads the remaining messages,
and the step fails without a materialization.

Fail safe: a run whose status cannot be read (an instance error), or a run the instance
does not know, is treated as running: an unknown never cancels anything. The failed read is
logged (once per kind of error, then at debug level), and the next check tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.contexts import run_id_of

log = logging.getLogger("dagster_slurm.jobs")

#: Dagster run statuses after which a step of the run must stop waiting. CANCELING is in
#: it: the run was asked to stop; the step's job must not run on while the run winds down.
ENDED_RUN_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELING", "CANCELED"})

#: Default seconds between two reads of the run's status while a step waits.
DEFAULT_RUN_STATUS_INTERVAL = 3.0


class DagsterRunEnded(DagsterSlurmError):
    """The step's own Dagster run is no longer running (``status``: its status name, e.g.
    ``FAILURE``), so the step stopped waiting; its Slurm job or step is cancelled and no
    materialization is reported."""

    def __init__(self, run_id: str, status: str, waiting_for: str = "Slurm") -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(
            f"run {run_id} is {status} in the Dagster instance while this step was waiting "
            f"for {waiting_for}; the step stops here: its Slurm work is cancelled and no "
            "materialization is reported. Re-execute the run to compute the asset."
        )


class RunFollower:
    """Reads the status of Dagster run ``run_id`` from ``instance``, at most every
    ``interval`` seconds (``clock``: monotonic seconds), for a step that waits on Slurm.

    ``instance`` None (a context without one) makes :meth:`check` a no-op.
    """

    def __init__(
        self,
        instance: Any,
        run_id: str | None,
        *,
        interval: float = DEFAULT_RUN_STATUS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval={interval!r}: must be positive")
        self.instance = instance
        self.run_id = run_id
        self.interval = interval
        self._clock = clock
        self._next = float("-inf")
        self._warned: set[str] = set()
        self.checks = 0

    @property
    def active(self) -> bool:
        """Whether there is a run to follow (an instance and a run id)."""
        return self.instance is not None and bool(self.run_id)

    def status(self) -> str | None:
        """The run's status name now (a fresh read); None when it cannot be read or the
        instance does not know the run (logged)."""
        if not self.active:
            return None
        self.checks += 1
        try:
            run = self.instance.get_run_by_id(self.run_id)
        except Exception as exc:  # noqa: BLE001 - unknown: logged, and the step keeps waiting
            self._unknown(type(exc).__name__, f"{type(exc).__name__}: {exc}")
            return None
        if run is None:
            self._unknown("missing", "the instance does not know the run")
            return None
        return str(getattr(run.status, "value", run.status))

    def check(self, waiting_for: str = "Slurm") -> None:
        """Raise :class:`DagsterRunEnded` when the run is no longer running; reads the
        instance only when ``interval`` seconds have passed since the last read."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.interval
        status = self.status()
        if status in ENDED_RUN_STATUSES:
            assert self.run_id is not None
            raise DagsterRunEnded(self.run_id, status, waiting_for)

    def _unknown(self, kind: str, why: str) -> None:
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        log.log(level, "status of run %s not known (%s); the step keeps waiting and asks "
                "again in %g s", self.run_id, why, self.interval)


def follower_for(context: Any, interval: float = DEFAULT_RUN_STATUS_INTERVAL) -> RunFollower:
    """The :class:`RunFollower` of a step's execution ``context`` (its instance and run id;
    inactive when the context has neither)."""
    return RunFollower(getattr(context, "instance", None), run_id_of(context), interval=interval)
