"""Watch a Ray cluster until released capacity stays idle: :func:`wait_for_stable_ray_resources`.

Ray itself is imported only by :func:`ray_available_resources`, the default resource
provider, so importing this module works without the ``ray`` extra; tests and callers that
pass their own provider never import Ray.

**Stable** means: ``stable_polls`` consecutive observations in which every resource named
in ``minimum_resources`` has the same available amount, and that amount is at least the
minimum. A resource the snapshot does not list counts as ``0`` (Ray omits a resource whose
whole capacity is in use). Resources not named in ``minimum_resources`` (``memory``,
``node:<address>``, other custom resources) are returned in the snapshot but neither
compared nor checked, so unrelated activity does not keep the watch from settling. A poll
that failed is not an observation: it neither counts toward the streak nor breaks it.

A snapshot is an observation, not a reservation: another cluster user may take the
resources right after it was read.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dagster_slurm.backoff import PollBackoff
from dagster_slurm.errors import ConfigurationError, DagsterSlurmError

log = logging.getLogger("dagster_slurm.ray")

#: A resource provider: called once per poll, returns the cluster's available resources
#: (resource name -> amount), like ``ray.available_resources()``.
ResourceProvider = Callable[[], Mapping[str, float]]


class RayResourcesUnavailable(DagsterSlurmError):
    """The resource provider failed on more consecutive polls than :class:`ProviderRetry`
    allows. ``failures`` is the number of failed polls in a row; the last provider error
    is the exception's ``__cause__``."""

    def __init__(self, failures: int, last_error: BaseException) -> None:
        self.failures = failures
        super().__init__(
            f"the Ray resource provider failed {failures} times in a row, last with "
            f"{type(last_error).__name__}: {last_error}; check that the Ray cluster is "
            "reachable, or allow more failures with ProviderRetry(retries=...)"
        )


def default_retryable_errors() -> tuple[type[BaseException], ...]:
    """The provider errors retried when :attr:`ProviderRetry.retry_on` is None.

    ``OSError`` (which covers ``ConnectionError`` and ``TimeoutError``) always; and, when
    the provider's process has imported them, ``ray.exceptions.RayError`` (Ray's RPC and
    system errors such as ``RpcError``, ``RaySystemError`` and ``GetTimeoutError``) and
    ``grpc.RpcError``. Ray is not imported to find out: a provider that has not imported
    Ray cannot raise Ray's errors. Any other exception (``ValueError``, ``TypeError``,
    ``KeyError``, ``RuntimeError`` ...) is taken for a bug and raised at once.
    """
    kinds: list[type[BaseException]] = [OSError]
    ray_exceptions = sys.modules.get("ray.exceptions")
    ray_error = getattr(ray_exceptions, "RayError", None)
    if isinstance(ray_error, type) and issubclass(ray_error, BaseException):
        kinds.append(ray_error)
    grpc_error = getattr(sys.modules.get("grpc"), "RpcError", None)
    if isinstance(grpc_error, type) and issubclass(grpc_error, BaseException):
        kinds.append(grpc_error)
    return tuple(kinds)


def _positive(field: str, value: object, *, zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 with ``zero``), or a ConfigurationError naming ``field``."""
    bound = "a finite number >= 0" if zero else "a finite number > 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(field, value, f"must be {bound} (seconds or an amount)")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        raise ConfigurationError(field, value, f"must be {bound}")
    return number


@dataclass(frozen=True)
class ProviderRetry:
    """Bounded exponential retry of a failing resource provider.

    ``retries`` failed polls in a row are retried; the failure after them raises
    :class:`RayResourcesUnavailable`. A successful poll resets the count and the backoff.
    The wait after the n-th failure in a row is
    ``min(initial_seconds * factor ** (n - 1), maximum_seconds)`` (never past the watch's
    timeout). ``retry_on`` lists the exception classes that count as provider errors;
    None means :func:`default_retryable_errors`. With the defaults, a provider that keeps
    failing is given up on after about 15 s (0.5 + 1 + 2 + 4 + 8).
    """

    retries: int = 5
    initial_seconds: float = 0.5
    maximum_seconds: float = 8.0
    factor: float = 2.0
    retry_on: tuple[type[BaseException], ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigurationError("retry.retries", self.retries, "must be an integer >= 0")
        _positive("retry.initial_seconds", self.initial_seconds)
        if _positive("retry.maximum_seconds", self.maximum_seconds) < self.initial_seconds:
            raise ConfigurationError("retry.maximum_seconds", self.maximum_seconds,
                                     f"must be >= retry.initial_seconds ({self.initial_seconds})")
        if _positive("retry.factor", self.factor) < 1:
            raise ConfigurationError("retry.factor", self.factor, "must be >= 1")
        if self.retry_on is not None and not (
            isinstance(self.retry_on, tuple)
            and all(isinstance(k, type) and issubclass(k, BaseException) for k in self.retry_on)
        ):
            raise ConfigurationError("retry.retry_on", self.retry_on,
                                     "must be a tuple of exception classes, or None for the defaults")


@dataclass(frozen=True)
class WatchSettings:
    """The checked arguments of one watch (see :func:`wait_for_stable_ray_resources`)."""

    minimum_resources: dict[str, float]
    stable_polls: int
    poll_interval_seconds: float
    timeout_seconds: float
    retry: ProviderRetry

    @classmethod
    def build(cls, minimum_resources: Mapping[str, float], stable_polls: int,
              poll_interval_seconds: float, timeout_seconds: float,
              retry: ProviderRetry | None) -> WatchSettings:
        """Check every argument; a ConfigurationError names the first wrong one."""
        if not isinstance(minimum_resources, Mapping) or not minimum_resources:
            raise ConfigurationError(
                "minimum_resources", minimum_resources,
                "must name every resource one reserve actor needs, e.g. {'GPU': 1, 'CPU': 4}")
        minimum: dict[str, float] = {}
        for name, amount in minimum_resources.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError("minimum_resources", minimum_resources,
                                         f"resource names must be non-empty strings, got {name!r}")
            minimum[name] = _positive(f"minimum_resources[{name!r}]", amount)
        if isinstance(stable_polls, bool) or not isinstance(stable_polls, int) or stable_polls < 1:
            raise ConfigurationError("stable_polls", stable_polls, "must be an integer >= 1")
        if retry is not None and not isinstance(retry, ProviderRetry):
            raise ConfigurationError("retry", retry, "must be a ProviderRetry or None")
        return cls(minimum, stable_polls, _positive("poll_interval_seconds", poll_interval_seconds),
                   _positive("timeout_seconds", timeout_seconds, zero=True),
                   retry or ProviderRetry())


class _Streak:
    """Counts consecutive observations with the same amounts of the named resources, each
    at least its minimum."""

    def __init__(self, minimum: dict[str, float], needed: int) -> None:
        self._minimum = minimum
        self._needed = needed
        self._amounts: tuple[float, ...] | None = None
        self._count = 0

    def observe(self, snapshot: dict[str, float]) -> bool:
        """Record one observation; True once ``needed`` in a row were the same and sufficient."""
        amounts = tuple(snapshot.get(name, 0.0) for name in self._minimum)
        if any(have < need for have, need in zip(amounts, self._minimum.values(), strict=True)):
            self._amounts, self._count = None, 0
            return False
        if amounts == self._amounts:
            self._count += 1
        else:
            self._amounts, self._count = amounts, 1
        return self._count >= self._needed


def _read(provider: ResourceProvider) -> dict[str, float]:
    """One poll of ``provider`` as a fresh ``{name: float}`` dict."""
    snapshot = provider()
    if not isinstance(snapshot, Mapping):
        raise TypeError(f"the resource provider returned {snapshot!r}; expected a mapping of "
                        "resource name to available amount, like ray.available_resources()")
    try:
        return {str(name): float(amount) for name, amount in snapshot.items()}
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the resource provider returned {dict(snapshot)!r}; every amount "
                        "must be a number") from exc


class _Failures:
    """The retry state of one watch: consecutive failures and the backoff between them."""

    def __init__(self, retry: ProviderRetry) -> None:
        self._retry = retry
        self._kinds = retry.retry_on if retry.retry_on is not None else default_retryable_errors()
        self._backoff = PollBackoff(retry.initial_seconds, retry.maximum_seconds, retry.factor)
        self.count = 0
        self.wait = retry.initial_seconds

    def poll(self, provider: ResourceProvider) -> dict[str, float] | None:
        """A snapshot, or None after a retryable failure (then :attr:`wait` says how long
        to wait); raises :class:`RayResourcesUnavailable` when the retries ran out and any
        other exception as it came."""
        try:
            snapshot = _read(provider)
        except self._kinds as exc:
            self.count += 1
            if self.count > self._retry.retries:
                raise RayResourcesUnavailable(self.count, exc) from exc
            self.wait = self._backoff.current
            self._backoff.observe(changed=False)
            log.warning("reading Ray's available resources failed (%d of %d allowed in a row): "
                        "%s: %s; retrying in %.1f s", self.count, self._retry.retries,
                        type(exc).__name__, exc, self.wait)
            return None
        if self.count:
            self._backoff.observe(changed=True)
            self.count = 0
        return snapshot


def ray_available_resources() -> dict[str, float]:
    """The default provider: ``ray.available_resources()`` of the connected Ray cluster.

    Raises RuntimeError (not retried) when this process is not connected to Ray, since
    waiting cannot fix that; call ``ray.init(address="auto")`` first.
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError("not connected to a Ray cluster: call ray.init(address='auto') "
                           "before watching its resources")
    return dict(ray.available_resources())


def watch(settings: WatchSettings, provider: ResourceProvider, *,
          stop: threading.Event | None, clock: Callable[[], float],
          sleep: Callable[[float], object]) -> dict[str, float] | None:
    """The watch loop of :func:`wait_for_stable_ray_resources`, with checked settings."""
    deadline = clock() + settings.timeout_seconds
    streak = _Streak(settings.minimum_resources, settings.stable_polls)
    failures = _Failures(settings.retry)
    while stop is None or not stop.is_set():
        snapshot = failures.poll(provider)
        if snapshot is not None and streak.observe(snapshot):
            return snapshot
        remaining = deadline - clock()
        if remaining <= 0:
            log.info("no stable Ray capacity of %s within %s s", settings.minimum_resources,
                     settings.timeout_seconds)
            return None
        pause = settings.poll_interval_seconds if snapshot is not None else failures.wait
        sleep(min(pause, remaining))
    return None


def wait_for_stable_ray_resources(
    minimum_resources: Mapping[str, float],
    *,
    stable_polls: int = 2,
    poll_interval_seconds: float = 1.0,
    timeout_seconds: float = 300.0,
    resources: ResourceProvider | None = None,
    retry: ProviderRetry | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] | None = None,
) -> dict[str, float] | None:
    """Poll the available resources until they are stable; return that snapshot.

    Stable (see the module docstring): ``stable_polls`` consecutive observations in which
    each resource of ``minimum_resources`` has the same available amount, at least its
    minimum (a resource missing from a snapshot counts as 0). ``minimum_resources`` should
    name every resource one reserve actor needs (GPUs and CPUs and custom resources).

    Returns the last observation of the stable streak, a new dict of every resource the
    provider reported (name -> available amount, floats), e.g. ``{"CPU": 8.0, "GPU": 2.0,
    "memory": ...}``. It is an observation, not a reservation. Returns None when
    ``timeout_seconds`` passed on ``clock`` without stability, or when ``stop`` was set.

    Polls run every ``poll_interval_seconds``; the first one at once, the last one at the
    deadline at the latest, so even ``timeout_seconds=0`` makes one observation.
    ``resources`` is the provider, called once per poll; None means
    :func:`ray_available_resources` (``ray.available_resources()`` of the connected
    cluster). A provider error listed by ``retry`` (:class:`ProviderRetry`, default: 5
    retries, 0.5 s doubling up to 8 s, Ray's RPC errors and ``OSError``) is retried; when
    the retries run out, :class:`RayResourcesUnavailable` is raised with the last error
    as its cause. Any other provider exception propagates at once. ``stop``: an event that
    another thread sets to end the watch early (checked before each poll; with the
    default ``sleep`` it also cuts a wait short). ``clock`` and ``sleep`` are injectable
    (defaults ``time.monotonic``, and ``stop.wait`` or ``time.sleep``).

    Invalid arguments raise :class:`~dagster_slurm.errors.ConfigurationError` before the
    first poll.
    """
    settings = WatchSettings.build(minimum_resources, stable_polls, poll_interval_seconds,
                                   timeout_seconds, retry)
    if sleep is None:
        sleep = stop.wait if stop is not None else time.sleep
    return watch(settings, resources or ray_available_resources, stop=stop, clock=clock,
                 sleep=sleep)
