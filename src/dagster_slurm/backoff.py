"""The one backoff every poll and retry loop of the library waits through.

:class:`PollBackoff` is pure: it says how long to wait, the caller sleeps (through its own
injected ``sleep``), so every schedule is unit-testable without waiting. A fixed interval is
a backoff with ``initial == maximum``. It sits below every other module so that any layer,
from the SSH transport to the run session, can use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class PollBackoff:
    """Poll interval that grows while nothing changes and resets on a change.

    ``initial`` is the first interval (seconds), multiplied by ``factor`` after every poll
    that saw no change, up to ``maximum``. :meth:`observe` returns the interval to wait
    before the next poll.
    """

    initial: float = 1.0
    maximum: float = 15.0
    factor: float = 1.5
    _current: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(
                f"poll intervals must satisfy 0 < initial <= maximum, got {self.initial}, {self.maximum}"
            )
        if self.factor < 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor}")
        self._current = self.initial

    def observe(self, changed: bool) -> float:
        """Record whether the last poll saw a change; return the next wait in seconds."""
        if changed:
            self._current = self.initial
        else:
            self._current = min(self._current * self.factor, self.maximum)
        return self._current

    def cap(self, maximum: float) -> None:
        """Lower the ceiling (e.g. below the scheduler's MinJobAge) without raising it."""
        self.maximum = max(self.initial, min(self.maximum, maximum))
        self._current = min(self._current, self.maximum)

    @property
    def current(self) -> float:
        """The interval that :meth:`observe` last returned (``initial`` before any poll)."""
        return self._current


def sleep_checking(sleep: Callable[[float], None], seconds: float,
                   check: Callable[[], None] | None, slice_seconds: float) -> None:
    """``sleep(seconds)`` in slices of at most ``slice_seconds``, calling ``check`` after
    each one (``check`` None: one plain sleep). A long back-off between two scheduler polls
    then still notices quickly what ``check`` looks at (e.g. the step's Dagster run ended);
    ``check`` raises to stop waiting."""
    if check is None:
        sleep(seconds)
        return
    remaining = seconds
    while remaining > 0:
        step = min(remaining, slice_seconds)
        sleep(step)
        remaining -= step
        check()


@dataclass
class StatusPace:
    """When a wait that reads files often asks the scheduler too: at ``backoff``'s pace.

    A wait for something a job announces in a file (a node's join, a head's ready file)
    reads that file every fraction of a second, but asks squeue, which only tells whether
    the job ended, no more often than the backoff says. :meth:`due` says whether the poll at
    ``now`` (the caller's clock) carries squeue; :meth:`asked` records that one did and
    whether it saw a change."""

    backoff: PollBackoff
    _next: float = float("-inf")

    def due(self, now: float) -> bool:
        """True when the poll at ``now`` should ask squeue (the first poll always does)."""
        return now >= self._next

    def asked(self, now: float, changed: bool = False) -> float:
        """Record a poll at ``now`` that asked squeue; returns when the next one is due."""
        self._next = now + self.backoff.observe(changed)
        return self._next

    def until_due(self, now: float) -> float:
        """Seconds from ``now`` until the next poll that asks squeue is due (0 when it is)."""
        return max(0.0, self._next - now)
