"""A login that needs a person ends the wait at once; other transport errors are retried."""

from __future__ import annotations

from typing import Any

import pytest

from dagster_slurm.backoff import PollBackoff
from dagster_slurm.errors import LoginRequired, TransportError
from dagster_slurm.scheduler.watcher import JobWatcher


class _Failing:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.polls = 0

    def status(self, names: Any, known: Any, **kwargs: Any) -> Any:
        self.polls += 1
        raise self.error

    def min_job_age(self) -> None:
        return None


@pytest.mark.parametrize(("error", "polls"), [(LoginRequired("run dagster-slurm login"), 1),
                                               (TransportError("link dropped"), 3)])
def test_a_failed_login_is_not_retried(error, polls):
    scheduler = _Failing(error)
    watcher = JobWatcher(scheduler, backoff=PollBackoff(initial=0.001, maximum=0.001))  # type: ignore[arg-type]
    watcher.track("7", "j")
    with pytest.raises(type(error)):
        watcher.wait("7", transport_retries=2)
    assert scheduler.polls == polls
