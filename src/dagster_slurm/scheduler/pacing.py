"""Pacing of scheduler calls: poll backoff (:class:`~dagster_slurm.backoff.PollBackoff`, the one
backoff of every poll and retry loop of the library) and a submission rate limit.

Slurm's documentation asks clients not to hammer slurmctld: poll with one query for many
jobs, back off while nothing changes, and space submissions. Both helpers here are pure
(the clock and sleep are injected), so their behaviour is unit-tested without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dagster_slurm.backoff import PollBackoff

__all__ = ["PollBackoff", "RateLimiter"]


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
