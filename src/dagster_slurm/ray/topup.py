"""Run a primary slice and top it up with a reserve slice on released Ray capacity:
:func:`run_with_ray_reserve_topup`.

Threads: ``primary`` runs in the calling thread, so an interrupt (Ctrl-C, Dagster's run
termination) reaches it there. One daemon thread watches the capacity
(:func:`~dagster_slurm.ray.capacity.watch`) and, once it is stable, calls ``reserve`` with
that snapshot, while ``primary`` may still be running.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from dagster_slurm.ray.capacity import (
    ProviderRetry,
    RayResourcesUnavailable,
    ResourceProvider,
    WatchSettings,
    ray_available_resources,
    watch,
)

log = logging.getLogger("dagster_slurm.ray")

P = TypeVar("P")
R = TypeVar("R")

#: Name of the thread that watches the capacity and then runs the reserve.
WATCH_THREAD_NAME = "dagster-slurm-reserve-watch"


@dataclass
class _Reserve(Generic[R]):
    """What the watch thread hands back; written by that thread, read after it ended or
    (``started``) under ``lock``."""

    lock: threading.Lock
    started: bool = False
    result: R | None = None
    error: BaseException | None = None


def _watch_then_reserve(settings: WatchSettings, provider: ResourceProvider,
                        reserve: Callable[[dict[str, float]], R], outcome: _Reserve[R],
                        stop: threading.Event, clock: Callable[[], float],
                        sleep: Callable[[float], object]) -> None:
    try:
        snapshot = watch(settings, provider, stop=stop, clock=clock, sleep=sleep)
    except RayResourcesUnavailable as exc:
        log.warning("the reserve does not run: %s", exc)
        return
    except BaseException as exc:  # handed to the calling thread, which raises it
        outcome.error = exc
        return
    with outcome.lock:
        if snapshot is None or stop.is_set():
            return
        outcome.started = True
    log.info("stable Ray capacity %s: starting the reserve", snapshot)
    try:
        outcome.result = reserve(snapshot)
    except BaseException as exc:  # handed to the calling thread, which raises it
        outcome.error = exc


def _primary_failed(error: BaseException, thread: threading.Thread, outcome: _Reserve,
                    stop: threading.Event) -> None:
    """Stop the watch after ``primary`` raised ``error``; wait for a running reserve unless
    ``error`` is an interrupt. The caller re-raises ``error``."""
    with outcome.lock:
        stop.set()
        started = outcome.started
    if started and not isinstance(error, Exception):
        return  # an interrupt: do not wait for the reserve; it ends with the process
    thread.join()
    if outcome.error is not None:
        log.warning("the reserve failed as well: %s: %s", type(outcome.error).__name__,
                    outcome.error)


def run_with_ray_reserve_topup(
    primary: Callable[[], P],
    reserve: Callable[[dict[str, float]], R],
    minimum_resources: Mapping[str, float],
    *,
    stable_polls: int = 2,
    poll_interval_seconds: float = 1.0,
    timeout_seconds: float = 300.0,
    resources: ResourceProvider | None = None,
    retry: ProviderRetry | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] | None = None,
) -> tuple[P, R | None]:
    """Run ``primary()`` now and ``reserve(snapshot)`` once released capacity is stable.

    ``primary`` (the fair-share slice) runs in the calling thread; at the same time a
    background thread watches the available resources exactly as
    :func:`~dagster_slurm.ray.capacity.wait_for_stable_ray_resources` does (same
    ``minimum_resources``, ``stable_polls``, ``poll_interval_seconds``, ``timeout_seconds``
    counted from this call, ``resources`` provider, ``retry``, ``clock`` and ``sleep``)
    and, as soon as they are stable, calls ``reserve`` with that snapshot (a dict of
    every available resource; an observation, not a reservation: Ray arbitrates a race
    with other users). ``reserve`` then runs alongside whatever is left of ``primary``.

    Returns ``(primary_result, reserve_result)`` once both have ended. ``reserve_result``
    is None when the reserve did not run: the capacity was not stable within
    ``timeout_seconds``, or the provider kept failing until the retries ran out (logged as
    a warning on ``dagster_slurm.ray``; the primary's result is kept); or ``reserve``
    itself returned None. Without a reserve run the caller still holds the reserve slice
    and decides what to do with it.

    * The watch does not end when ``primary`` returns: its own resources are then released
      too, so the reserve may start on them, until ``timeout_seconds``. The call returns
      when the watch timed out or the reserve finished.
    * ``primary`` raised: the watch is stopped and the reserve is not started; the
      exception propagates once the watch thread ended. If the reserve was already
      running, the call waits for it to finish (its result is discarded, an error of it is
      logged) and then raises; for an interrupt (an exception not derived from
      ``Exception``, e.g. KeyboardInterrupt) it raises at once, without waiting.
    * ``reserve`` raised: that exception propagates once ``primary`` returned (the
      primary's result is then lost; catch inside ``reserve`` to keep it).
    * A provider error that is not retried (a bug in a custom provider, or not connected
      to Ray) propagates once ``primary`` returned.

    Invalid arguments raise :class:`~dagster_slurm.errors.ConfigurationError` before
    ``primary`` runs.
    """
    settings = WatchSettings.build(minimum_resources, stable_polls, poll_interval_seconds,
                                   timeout_seconds, retry)
    stop = threading.Event()
    outcome: _Reserve[R] = _Reserve(threading.Lock())
    thread = threading.Thread(
        target=_watch_then_reserve, name=WATCH_THREAD_NAME, daemon=True,
        args=(settings, resources or ray_available_resources, reserve, outcome, stop, clock,
              sleep or stop.wait),
    )
    thread.start()
    try:
        primary_result = primary()
    except BaseException as exc:
        _primary_failed(exc, thread, outcome, stop)
        raise
    try:
        thread.join()
    except BaseException:  # interrupted while waiting: stop a watch that has not settled
        stop.set()
        raise
    if outcome.error is not None:
        raise outcome.error
    return primary_result, outcome.result
