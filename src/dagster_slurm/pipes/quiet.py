"""Dagster's "no Pipes messages" warning, kept for the payloads and runs it is meant for.

When a Pipes session closes without a single message from its payload,
``open_pipes_session`` logs a warning on the step's logger ("[pipes] did not receive any
messages from external process ..."). For a payload that should have opened Pipes (a Python
script calling ``open_dagster_pipes()``) and ran, that is a useful hint. It is wrong in two
cases: a shell script never opens Pipes (its output reaches the compute logs, its exit
status decides success, and the warning would appear on every run of it), and a payload
that never started (its job could never start, its submission was refused) had no chance
to: the warning would send the user looking at the payload's code instead of at the error.

:func:`pipes_warning_scope` wraps the session of one payload with a
:class:`logging.Filter` on the step's logger. For a payload expected to open Pipes it passes
every record, until the runner calls :meth:`NoMessagesWarningFilter.never_started`; for
any other payload, and from that call on, it drops exactly that warning (it is logged at
debug level on the ``dagster_slurm.pipes`` logger instead, with the reason). Every other
record passes, and the filter is removed when the session ends, whether it ended normally
or not.

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

NO_PIPES = "a payload that does not open Pipes"
"""The reason for a payload that never opens Pipes (a shell script)."""


class NoMessagesWarningFilter(logging.Filter):
    """Drops the warning-level records that begin with :data:`NO_MESSAGES_WARNING` once it
    has a reason to (``reason``: why no message was to be expected; None: none yet, every
    record passes); ``payload`` (the payload's path or command) and the reason go into the
    debug line logged instead."""

    def __init__(self, payload: str, reason: str | None = NO_PIPES) -> None:
        super().__init__()
        self.payload = payload
        self.reason = reason
        self.dropped = 0
        """How many records were dropped."""

    def never_started(self, reason: str) -> None:
        """The payload never started (``reason`` says why): no Pipes message was to be
        expected, so the warning is dropped from now on."""
        self.reason = self.reason or reason

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if (self.reason is not None and record.levelno == logging.WARNING
                and isinstance(message, str) and message.startswith(NO_MESSAGES_WARNING)):
            self.dropped += 1
            log.debug("no Pipes message from %s: %s", self.payload, self.reason)
            return False
        return True


@contextmanager
def pipes_warning_scope(step_log: object, *, payload: str,
                        opens_pipes: bool) -> Iterator[NoMessagesWarningFilter]:
    """Around a Pipes session for ``payload``: with ``opens_pipes`` False, Dagster's "no
    messages" warning on ``step_log`` (the step's ``context.log``) is dropped until the
    block ends; with ``opens_pipes`` True, only after the yielded filter's
    :meth:`~NoMessagesWarningFilter.never_started`. A ``step_log`` that is not a
    :class:`logging.Logger` is left alone (the filter is yielded all the same)."""
    quiet = NoMessagesWarningFilter(payload, None if opens_pipes else NO_PIPES)
    if not isinstance(step_log, logging.Logger):
        yield quiet
        return
    step_log.addFilter(quiet)
    try:
        yield quiet
    finally:
        step_log.removeFilter(quiet)
