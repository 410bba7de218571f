"""wait_for_stable_ray_resources and run_with_ray_reserve_topup with a scripted resource
provider and a fake clock: what "stable" means, the timeout, the provider retry, and how
the primary, the watch and the reserve end together. Real Ray: tests/integration/test_ray_capacity.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterable, Mapping

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.ray import (
    ProviderRetry,
    RayResourcesUnavailable,
    default_retryable_errors,
    run_with_ray_reserve_topup,
    wait_for_stable_ray_resources,
)
from dagster_slurm.ray.topup import WATCH_THREAD_NAME

DEADLINE = 10.0  # seconds a test waits for an event of another thread before it fails
FREE = {"CPU": 8.0, "GPU": 2.0, "memory": 1e9}
BUSY = {"CPU": 8.0, "memory": 1e9}  # Ray leaves out a resource with nothing available
NEED = {"GPU": 1, "CPU": 4}


class FakeClock:
    """A monotonic clock that only ``sleep`` moves; records every sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds


class Script:
    """A resource provider answering from a list (an exception instance is raised), then
    repeating ``then`` (a snapshot, or a callable returning one); records the clock at
    each call."""

    def __init__(self, clock: FakeClock, items: Iterable[object],
                 then: Mapping[str, float] | Callable[[], Mapping[str, float]] = BUSY) -> None:
        self.clock = clock
        self.items = list(items)
        self.then = then
        self.calls: list[float] = []

    def __call__(self) -> Mapping[str, float]:
        self.calls.append(self.clock())
        item = self.items.pop(0) if self.items else self.then
        if isinstance(item, BaseException):
            raise item
        return item() if callable(item) else item  # type: ignore[return-value]


def wait(clock: FakeClock, provider: Script, **kwargs: object):
    return wait_for_stable_ray_resources(NEED, resources=provider, clock=clock,
                                         sleep=clock.sleep, **kwargs)


# --- what stable means -------------------------------------------------------------------

def test_stable_after_stable_polls_equal_sufficient_observations() -> None:
    clock = FakeClock()
    provider = Script(clock, [BUSY, FREE, FREE, FREE])
    snapshot = wait(clock, provider, stable_polls=3, poll_interval_seconds=2)
    assert snapshot == FREE
    assert len(provider.calls) == 4
    assert clock.sleeps == [2, 2, 2]


def test_the_snapshot_is_the_last_observation_as_a_new_float_dict() -> None:
    clock = FakeClock()
    last = {"CPU": 4, "GPU": 1, "memory": 7, "node:10.0.0.1": 1}
    provider = Script(clock, [{"CPU": 4, "GPU": 1, "memory": 5}, last])
    snapshot = wait(clock, provider, stable_polls=2)
    assert snapshot == {"CPU": 4.0, "GPU": 1.0, "memory": 7.0, "node:10.0.0.1": 1.0}
    assert all(isinstance(v, float) for v in snapshot.values()) and snapshot is not last


def test_a_changed_amount_of_a_named_resource_restarts_the_streak() -> None:
    clock = FakeClock()
    more = {"CPU": 8.0, "GPU": 3.0}
    provider = Script(clock, [FREE, more, FREE, FREE])
    assert wait(clock, provider, stable_polls=2) == FREE
    assert len(provider.calls) == 4


def test_an_insufficient_observation_restarts_the_streak() -> None:
    clock = FakeClock()
    short_of_cpu = {"CPU": 3.0, "GPU": 2.0}
    provider = Script(clock, [FREE, short_of_cpu, FREE, FREE])
    assert wait(clock, provider, stable_polls=2) == FREE
    assert len(provider.calls) == 4


def test_unnamed_resources_may_change_without_breaking_the_streak() -> None:
    clock = FakeClock()
    provider = Script(clock, [{**FREE, "memory": 1.0}, {**FREE, "memory": 2.0, "x": 1.0}])
    assert wait(clock, provider, stable_polls=2) == {**FREE, "memory": 2.0, "x": 1.0}


def test_a_missing_resource_counts_as_zero() -> None:
    clock = FakeClock()
    provider = Script(clock, [], then=BUSY)
    assert wait(clock, provider, stable_polls=1, timeout_seconds=5) is None
    assert wait_for_stable_ray_resources({"GPU": 0.5}, resources=Script(clock, [{"GPU": 0.5}]),
                                         stable_polls=1, clock=clock, sleep=clock.sleep) == {"GPU": 0.5}


def test_one_stable_poll_returns_the_first_sufficient_observation() -> None:
    clock = FakeClock()
    provider = Script(clock, [BUSY, FREE])
    assert wait(clock, provider, stable_polls=1) == FREE
    assert len(provider.calls) == 2


# --- timeout and stop --------------------------------------------------------------------

def test_timeout_returns_none_with_the_last_poll_at_the_deadline() -> None:
    clock = FakeClock()
    start = clock.now
    provider = Script(clock, [], then=BUSY)
    assert wait(clock, provider, poll_interval_seconds=3, timeout_seconds=10) is None
    assert [t - start for t in provider.calls] == [0, 3, 6, 9, 10]


def test_a_zero_timeout_makes_one_observation() -> None:
    clock = FakeClock()
    provider = Script(clock, [FREE], then=FREE)
    assert wait(clock, provider, stable_polls=1, timeout_seconds=0) == FREE
    busy = Script(clock, [], then=BUSY)
    assert wait(clock, busy, timeout_seconds=0) is None
    assert len(busy.calls) == 1 and clock.sleeps == []


def test_a_streak_still_short_at_the_deadline_is_not_stable() -> None:
    clock = FakeClock()
    provider = Script(clock, [BUSY, BUSY], then=FREE)
    assert wait(clock, provider, stable_polls=3, poll_interval_seconds=1, timeout_seconds=3) is None


def test_a_set_stop_event_ends_the_watch_with_none() -> None:
    clock = FakeClock()
    stop = threading.Event()

    def then() -> Mapping[str, float]:
        stop.set()
        return BUSY

    provider = Script(clock, [], then=then)
    assert wait(clock, provider, stop=stop, timeout_seconds=1e9) is None
    assert len(provider.calls) == 1


def test_the_default_sleep_of_a_stoppable_watch_is_cut_short_by_stop() -> None:
    stop = threading.Event()
    calls: list[int] = []

    def provider() -> Mapping[str, float]:
        calls.append(1)
        threading.Timer(0.05, stop.set).start()
        return BUSY

    result = wait_for_stable_ray_resources(NEED, resources=provider, stop=stop,
                                           poll_interval_seconds=3600, timeout_seconds=7200)
    assert result is None and calls == [1]


# --- provider errors ---------------------------------------------------------------------

def test_transient_errors_are_retried_with_capped_exponential_waits() -> None:
    clock = FakeClock()
    errors = [ConnectionError("gcs down")] * 6
    provider = Script(clock, [*errors, FREE, FREE])
    retry = ProviderRetry(retries=6, initial_seconds=0.5, maximum_seconds=4, factor=2)
    assert wait(clock, provider, retry=retry, poll_interval_seconds=1) == FREE
    assert clock.sleeps == [0.5, 1, 2, 4, 4, 4, 1]


def test_a_success_resets_the_failure_count_and_the_backoff() -> None:
    clock = FakeClock()
    boom = TimeoutError("rpc")
    provider = Script(clock, [boom, boom, BUSY, boom, boom, BUSY, FREE, FREE])
    retry = ProviderRetry(retries=2, initial_seconds=1, maximum_seconds=10)
    assert wait(clock, provider, retry=retry, poll_interval_seconds=5) == FREE
    assert clock.sleeps == [1, 2, 5, 1, 2, 5, 5]


def test_a_failed_poll_neither_counts_toward_nor_breaks_the_streak() -> None:
    clock = FakeClock()
    provider = Script(clock, [FREE, OSError("blip"), FREE])
    assert wait(clock, provider, stable_polls=2) == FREE
    assert len(provider.calls) == 3


def test_when_the_retries_run_out_the_last_error_is_the_cause() -> None:
    clock = FakeClock()
    last = ConnectionError("third")
    provider = Script(clock, [ConnectionError("1"), ConnectionError("2"), last])
    with pytest.raises(RayResourcesUnavailable, match="3 times in a row.*third") as raised:
        wait(clock, provider, retry=ProviderRetry(retries=2))
    assert raised.value.__cause__ is last and raised.value.failures == 3
    assert len(provider.calls) == 3


def test_zero_retries_gives_up_on_the_first_failure() -> None:
    clock = FakeClock()
    with pytest.raises(RayResourcesUnavailable):
        wait(clock, Script(clock, [OSError("x")]), retry=ProviderRetry(retries=0))


def test_a_retry_wait_never_passes_the_deadline_and_the_timeout_still_wins() -> None:
    clock = FakeClock()
    start = clock.now
    provider = Script(clock, [], then=lambda: (_ for _ in ()).throw(OSError("down")))
    retry = ProviderRetry(retries=100, initial_seconds=4, maximum_seconds=4)
    assert wait(clock, provider, retry=retry, timeout_seconds=10) is None
    assert [t - start for t in provider.calls] == [0, 4, 8, 10]


def test_an_error_that_is_not_retryable_propagates_at_once() -> None:
    clock = FakeClock()
    provider = Script(clock, [ValueError("bug")], then=FREE)
    with pytest.raises(ValueError, match="bug"):
        wait(clock, provider)
    assert len(provider.calls) == 1


def test_retry_on_replaces_the_default_kinds() -> None:
    class Flaky(Exception):
        pass

    clock = FakeClock()
    assert wait(clock, Script(clock, [Flaky(), FREE, FREE]),
                retry=ProviderRetry(retry_on=(Flaky,))) == FREE
    with pytest.raises(ConnectionError):
        wait(clock, Script(clock, [ConnectionError()]), retry=ProviderRetry(retry_on=(Flaky,)))


def test_rays_own_errors_are_retried_once_ray_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("ray.exceptions")

    class RayError(Exception):
        pass

    class RpcError(RayError):
        pass

    fake.RayError = RayError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.exceptions", fake)
    assert RayError in default_retryable_errors() and OSError in default_retryable_errors()
    clock = FakeClock()
    assert wait(clock, Script(clock, [RpcError("gcs"), FREE, FREE])) == FREE


def test_a_provider_answer_that_is_not_a_mapping_of_numbers_is_a_type_error() -> None:
    clock = FakeClock()
    with pytest.raises(TypeError, match="expected a mapping"):
        wait(clock, Script(clock, [], then=[("GPU", 1)]))  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must be a number"):
        wait(clock, Script(clock, [], then={"GPU": "many"}))  # type: ignore[dict-item]


# --- argument checks ---------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "field"), [
    ({"minimum_resources": {}}, "minimum_resources"),
    ({"minimum_resources": ["GPU"]}, "minimum_resources"),
    ({"minimum_resources": {"GPU": 0}}, "minimum_resources['GPU']"),
    ({"minimum_resources": {"GPU": -1}}, "minimum_resources['GPU']"),
    ({"minimum_resources": {"GPU": True}}, "minimum_resources['GPU']"),
    ({"minimum_resources": {"GPU": float("nan")}}, "minimum_resources['GPU']"),
    ({"minimum_resources": {"": 1}}, "minimum_resources"),
    ({"stable_polls": 0}, "stable_polls"),
    ({"stable_polls": 1.5}, "stable_polls"),
    ({"poll_interval_seconds": 0}, "poll_interval_seconds"),
    ({"timeout_seconds": -1}, "timeout_seconds"),
    ({"timeout_seconds": float("inf")}, "timeout_seconds"),
    ({"timeout_seconds": None}, "timeout_seconds"),
    ({"retry": 3}, "retry"),
])
def test_invalid_arguments_name_the_field(kwargs: dict, field: str) -> None:
    arguments = {"minimum_resources": NEED, **kwargs}
    with pytest.raises(ConfigurationError) as raised:
        wait_for_stable_ray_resources(resources=lambda: pytest.fail("polled"), **arguments)
    assert raised.value.field == field


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"retries": -1}, "retry.retries"),
    ({"initial_seconds": 0}, "retry.initial_seconds"),
    ({"initial_seconds": 5, "maximum_seconds": 1}, "retry.maximum_seconds"),
    ({"factor": 0.5}, "retry.factor"),
    ({"retry_on": (ValueError, "x")}, "retry.retry_on"),
    ({"retry_on": [OSError]}, "retry.retry_on"),
])
def test_invalid_retry_settings_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        ProviderRetry(**kwargs)
    assert raised.value.field == field


def test_importing_the_package_does_not_import_ray() -> None:
    code = "import sys, dagster_slurm.ray; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_the_default_provider_refuses_without_a_ray_connection() -> None:
    pytest.importorskip("ray")
    code = (
        "from dagster_slurm.ray import wait_for_stable_ray_resources as w\n"
        "try:\n    w({'CPU': 1})\nexcept RuntimeError as e:\n    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert "refused: not connected to a Ray cluster" in out.stdout, out.stderr


# --- run_with_ray_reserve_topup -----------------------------------------------------------

def topup(clock: FakeClock, provider: Script, primary: Callable[[], object],
          reserve: Callable[[dict[str, float]], object], **kwargs: object):
    return run_with_ray_reserve_topup(primary, reserve, NEED, resources=provider,
                                      clock=clock, sleep=clock.sleep, **kwargs)


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WATCH_THREAD_NAME and t.is_alive()]


def test_the_reserve_starts_with_the_stable_snapshot_while_the_primary_runs() -> None:
    clock = FakeClock()
    reserve_started = threading.Event()
    seen: list[dict[str, float]] = []

    def primary() -> str:
        assert reserve_started.wait(DEADLINE), "the reserve did not start during the primary"
        return "primary"

    def reserve(available: dict[str, float]) -> int:
        seen.append(available)
        reserve_started.set()
        return int(available["GPU"])

    result = topup(clock, Script(clock, [BUSY, BUSY, FREE, FREE]), primary, reserve)
    assert result == ("primary", 2)
    assert seen == [FREE]
    assert not watch_threads()


def test_no_stable_capacity_within_the_timeout_gives_no_reserve() -> None:
    clock = FakeClock()
    start = clock.now
    provider = Script(clock, [], then=BUSY)
    result = topup(clock, provider, lambda: "p", lambda _: pytest.fail("reserve ran"),
                   timeout_seconds=30, poll_interval_seconds=10)
    assert result == ("p", None)
    assert [t - start for t in provider.calls] == [0, 10, 20, 30]


def test_the_watch_continues_after_the_primary_returned() -> None:
    clock = FakeClock()
    primary_done = threading.Event()

    def after_primary() -> Mapping[str, float]:
        assert primary_done.wait(DEADLINE)
        return FREE

    order: list[str] = []
    provider = Script(clock, [BUSY], then=after_primary)

    def primary() -> str:
        order.append("primary")
        primary_done.set()
        return "p"

    def reserve(available: dict[str, float]) -> str:
        order.append("reserve")
        return "r"

    assert topup(clock, provider, primary, reserve) == ("p", "r")
    assert order == ["primary", "reserve"]


def test_a_failing_primary_stops_the_watch_and_the_reserve_never_starts() -> None:
    clock = FakeClock()
    start = clock.now
    primary_raised = threading.Event()

    def after_failure() -> Mapping[str, float]:
        assert primary_raised.wait(DEADLINE)
        return BUSY

    provider = Script(clock, [BUSY], then=after_failure)

    def primary() -> str:
        primary_raised.set()
        raise RuntimeError("primary broke")

    with pytest.raises(RuntimeError, match="primary broke"):
        topup(clock, provider, primary, lambda _: pytest.fail("reserve ran"),
              timeout_seconds=1e12, poll_interval_seconds=1)
    assert not watch_threads()
    assert clock.now - start < 1e12  # ended by the failure, not by the timeout


def test_a_failing_primary_waits_for_a_running_reserve_then_raises() -> None:
    clock = FakeClock()
    reserve_started = threading.Event()
    reserve_finished = threading.Event()

    def primary() -> str:
        assert reserve_started.wait(DEADLINE)
        raise RuntimeError("primary broke")

    def reserve(available: dict[str, float]) -> str:
        reserve_started.set()
        reserve_finished.set()
        return "r"

    with pytest.raises(RuntimeError, match="primary broke"):
        topup(clock, Script(clock, [FREE, FREE]), primary, reserve)
    assert reserve_finished.is_set() and not watch_threads()


def test_an_interrupt_of_the_primary_does_not_wait_for_the_reserve() -> None:
    clock = FakeClock()
    reserve_started = threading.Event()
    let_reserve_end = threading.Event()

    def primary() -> str:
        assert reserve_started.wait(DEADLINE)
        raise KeyboardInterrupt

    def reserve(available: dict[str, float]) -> str:
        reserve_started.set()
        let_reserve_end.wait(DEADLINE)
        return "r"

    try:
        with pytest.raises(KeyboardInterrupt):
            topup(clock, Script(clock, [FREE, FREE]), primary, reserve)
        assert watch_threads(), "the call waited for the reserve"
    finally:
        let_reserve_end.set()
        for thread in watch_threads():
            thread.join(DEADLINE)


def test_a_failing_reserve_raises_after_the_primary_returned() -> None:
    clock = FakeClock()
    reserve_failed = threading.Event()
    primary_returned: list[bool] = []

    def primary() -> str:
        assert reserve_failed.wait(DEADLINE)
        primary_returned.append(True)
        return "p"

    def reserve(available: dict[str, float]) -> str:
        reserve_failed.set()
        raise ValueError("reserve broke")

    with pytest.raises(ValueError, match="reserve broke"):
        topup(clock, Script(clock, [FREE, FREE]), primary, reserve)
    assert primary_returned == [True]


def test_a_provider_out_of_retries_keeps_the_primary_result(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    provider = Script(clock, [], then=lambda: (_ for _ in ()).throw(ConnectionError("gone")))
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.ray"):
        result = topup(clock, provider, lambda: "p", lambda _: pytest.fail("reserve ran"),
                       retry=ProviderRetry(retries=2))
    assert result == ("p", None)
    assert len(provider.calls) == 3
    assert any("the reserve does not run" in r.getMessage() and "gone" in r.getMessage()
               for r in caplog.records)


def test_a_provider_bug_raises_after_the_primary_returned() -> None:
    clock = FakeClock()
    primary_ran: list[bool] = []

    def primary() -> str:
        primary_ran.append(True)
        return "p"

    with pytest.raises(KeyError):
        topup(clock, Script(clock, [KeyError("GPU")]), primary, lambda _: pytest.fail("reserve ran"))
    assert primary_ran == [True]


def test_invalid_arguments_fail_before_the_primary_runs() -> None:
    with pytest.raises(ConfigurationError) as raised:
        run_with_ray_reserve_topup(lambda: pytest.fail("primary ran"), lambda _: None,
                                   {"GPU": 1}, stable_polls=0, resources=lambda: FREE)
    assert raised.value.field == "stable_polls"
    assert not watch_threads()
