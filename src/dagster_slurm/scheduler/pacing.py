"""Pacing of scheduler calls: poll backoff and a submission rate limit.

Slurm's documentation asks clients not to hammer slurmctld: poll with one query for many
jobs, back off while nothing changes, and space submissions. Both helpers here are pure
(the clock and sleep are injected), so their behaviour is unit-tested without waiting.
"""

from __future__ import annotations

import threading
import time
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


class RateLimiter:
    """At most one event per ``min_interval`` seconds across the threads of a process.

    :meth:`acquire` blocks (through the injected ``sleep``) until the next slot and returns
    the seconds it waited.
    """

    def __init__(
        self,
        min_interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if min_interval < 0:
            raise ValueError(f"min_interval must be >= 0, got {min_interval}")
        self.min_interval = min_interval
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next = float("-inf")

    def acquire(self) -> float:
        with self._lock:
            now = self._clock()
            slot = max(now, self._next)
            self._next = slot + self.min_interval
        wait = slot - now
        if wait > 0:
            self._sleep(wait)
        return wait
