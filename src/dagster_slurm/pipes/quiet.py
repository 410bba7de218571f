"""Dagster's "no Pipes messages" warning, kept for the payloads it is meant for.

When a Pipes session closes without a single message from its payload,
``open_pipes_session`` logs a warning on the step's logger ("[pipes] did not receive any
messages from external process ..."). For a payload that should have opened Pipes (a Python
script calling ``open_dagster_pipes()``) that is a useful hint. A shell script never opens
Pipes: its output reaches the compute logs, its exit status decides success, and the
warning would appear on every run of it.

:func:`pipes_warning_scope` wraps the session of one payload. When the payload is expected
to open Pipes it changes nothing. Otherwise it adds a :class:`logging.Filter` to the step's
logger for the duration of the session which drops exactly that warning (it is logged at
debug level on the ``dagster_slurm.pipes`` logger instead); every other record passes, and
the filter is removed when the session ends, whether it ended normally or not.

If a Dagster release rewords the warning, the filter no longer matches and the warning
shows again: nothing else is ever hidden.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NO_MESSAGES_WARNING", "NoMessagesWarningFilter", "pipes_warning_scope"]

log = logging.getLogger("dagster_slurm.pipes")

NO_MESSAGES_WARNING = "[pipes] did not receive any messages from external process"
"""How Dagster's warning about a session without any Pipes message begins."""


class NoMessagesWarningFilter(logging.Filter):
    """Drops the warning-level records that begin with :data:`NO_MESSAGES_WARNING`;
    ``payload`` (the payload's path or command) goes into the debug line logged instead."""

    def __init__(self, payload: str) -> None:
        super().__init__()
        self.payload = payload
        self.dropped = 0
        """How many records were dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if (record.levelno == logging.WARNING and isinstance(message, str)
                and message.startswith(NO_MESSAGES_WARNING)):
            self.dropped += 1
            log.debug("no Pipes message from %s, a payload that does not open Pipes",
                      self.payload)
            return False
        return True


@contextmanager
def pipes_warning_scope(step_log: object, *, payload: str,
                        opens_pipes: bool) -> Iterator[NoMessagesWarningFilter | None]:
    """Around a Pipes session for ``payload``: with ``opens_pipes`` False, Dagster's "no
    messages" warning on ``step_log`` (the step's ``context.log``) is dropped until the
    block ends. Yields the filter in use, or None when nothing is filtered (``opens_pipes``
    True, or a ``step_log`` that is not a :class:`logging.Logger`)."""
    if opens_pipes or not isinstance(step_log, logging.Logger):
        yield None
        return
    quiet = NoMessagesWarningFilter(payload)
    step_log.addFilter(quiet)
    try:
        yield quiet
    finally:
        step_log.removeFilter(quiet)
