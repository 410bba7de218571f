"""Warnings of the connection layers in the step's Dagster log, not only on stderr.

The SSH transport, the cluster-side agent's client, the scheduler client and the Pipes
reader log on Python loggers (:data:`RELAYED_LOGGERS`): a lost connection and its
reconnection, a login retried, a scheduler poll that failed and is retried, an agent process
replaced, a Pipes read retried. Python logging writes them to stderr (where a Dagster
deployment keeps them in the process's log, not in the run's), so a user looking at the run
in Dagster's UI does not see why a step paused for a minute.

While a step runs, :func:`step_log_relay` copies them to the step's Dagster log
(``context.log``): one handler on the ``dagster_slurm`` logger forwards each record of
WARNING or above from those loggers to the step log of the context the record was made in
(a :class:`contextvars.ContextVar` set for the duration of the step). The step's own thread
and the Pipes reader's thread (which runs in a copy of the step's context) are covered;
threads that belong to no step (a run session's housekeeping) are not, and a record made in
one step is never written to another step's log. Records still go to their Python handlers
as before.

If a Dagster instance already captures the ``dagster_slurm`` logger
(``python_logs.managed_python_loggers``), such a warning appears twice in the run's log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["RELAYED_LOGGERS", "step_log_relay"]

RELAYED_LOGGERS: tuple[str, ...] = (
    "dagster_slurm.ssh",
    "dagster_slurm.agent",
    "dagster_slurm.scheduler",
    "dagster_slurm.pipes",
)
"""The loggers whose warnings reach the step's Dagster log (and their children)."""

_STEP_LOG: ContextVar[Any] = ContextVar("dagster_slurm_step_log", default=None)
_RELAYING: ContextVar[bool] = ContextVar("dagster_slurm_relaying", default=False)


class StepLogRelay(logging.Handler):
    """Forwards WARNING-and-above records of :data:`RELAYED_LOGGERS` to the step log set in
    the context they were made in (none: nothing is forwarded)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        step_log = _STEP_LOG.get()
        if step_log is None or _RELAYING.get() or not relayed(record.name):
            return
        write = getattr(step_log, "error" if record.levelno >= logging.ERROR else "warning", None)
        if write is None:  # a stand-in log without that level
            return
        token = _RELAYING.set(True)  # the step log must not feed back into this handler
        try:
            write(record.getMessage())
        except Exception:  # noqa: BLE001 - a log line must never fail the step
            self.handleError(record)
        finally:
            _RELAYING.reset(token)


def relayed(name: str) -> bool:
    """Whether records of logger ``name`` are relayed (one of :data:`RELAYED_LOGGERS` or
    below one)."""
    return any(name == base or name.startswith(base + ".") for base in RELAYED_LOGGERS)


_HANDLER = StepLogRelay()


def _install() -> None:
    package = logging.getLogger("dagster_slurm")
    if _HANDLER not in package.handlers:
        package.addHandler(_HANDLER)


@contextmanager
def step_log_relay(step_log: Any) -> Iterator[None]:
    """While the block runs, warnings of :data:`RELAYED_LOGGERS` made in this context also
    go to ``step_log`` (a Dagster ``context.log`` or any object with ``warning`` and
    ``error``). None: nothing changes. Blocks nest; the innermost step log wins."""
    if step_log is None:
        yield
        return
    _install()
    token = _STEP_LOG.set(step_log)
    try:
        yield
    finally:
        _STEP_LOG.reset(token)
