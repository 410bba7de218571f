from __future__ import annotations

import pytest

from dagster_slurm.backoff import StatusPace
from dagster_slurm.scheduler.pacing import PollBackoff, RateLimiter


def test_backoff_grows_while_quiet_and_resets_on_change():
    b = PollBackoff(initial=1, maximum=4, factor=2)
    assert [b.observe(False) for _ in range(4)] == [2, 4, 4, 4]
    assert b.observe(True) == 1


def test_backoff_cap_never_raises_the_ceiling():
    b = PollBackoff(initial=1, maximum=10, factor=2)
    b.cap(30)
    assert b.maximum == 10
    b.cap(3)
    assert [b.observe(False) for _ in range(3)] == [2, 3, 3]


@pytest.mark.parametrize("kwargs", [{"initial": 0}, {"initial": 5, "maximum": 1}, {"factor": 0.5}])
def test_backoff_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        PollBackoff(**kwargs)


def test_rate_limiter_spaces_events():
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    limiter = RateLimiter(0.5, clock=lambda: now[0], sleep=sleep)
    waits = [limiter.acquire() for _ in range(3)]
    assert waits == [0, 0.5, 0.5]
    now[0] += 10
    assert limiter.acquire() == 0


def test_status_pace_asks_the_scheduler_at_the_backoffs_pace_only():
    pace = StatusPace(PollBackoff(initial=1.0, maximum=4.0, factor=2.0))
    assert pace.due(0.0)  # the first poll asks
    assert pace.asked(0.0) == 2.0  # no change: the interval grows
    assert not pace.due(0.2) and not pace.due(1.9) and pace.due(2.0)
    assert pace.until_due(0.5) == 1.5 and pace.until_due(2.5) == 0.0
    assert pace.asked(2.0) == 6.0  # capped at 4 s
    assert pace.asked(6.0, changed=True) == 7.0  # a change starts again at 1 s
