"""The run tag after promotions: a repeated promotion repairs it but never sets it back from an
allocation promoted later, whose steps tag the run with it; a successor drained before its
promotion is promoted with a warning. In-memory cluster, fake clock (no real sleeps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from running_heads import new_session, running_head, start_on_promotion
from session_fakes import FakeCluster

from dagster_slurm.session.core.io import DocumentRead
from dagster_slurm.session.session import RunSession


class RunTag:
    """The run's ``dagster-slurm/allocation`` tag: its value and every write, by writer."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.writes: list[tuple[str, str]] = []

    def writer(self, who: str) -> Callable[[str], None]:
        def write(job_id: str) -> None:
            self.value = job_id
            self.writes.append((who, job_id))
        return write


def _promote_next(cluster: FakeCluster, tag: RunTag) -> str:
    """Another process queues and promotes the next successor, then a step of it starts and
    tags the run with the allocation it runs in (what the session runner does); returns its
    job id. That process has no Dagster context: only the step writes the tag."""
    other, _ = new_session(cluster)
    other.publish_allocation = None
    successor = other.submit_successor()
    cluster.run_without_ready(successor.job_id)
    start_on_promotion(cluster, successor.job_id)
    other.promote_successor()
    tag.writer("step in the successor")(other.ensure().job_id)
    return successor.job_id


def _on_read(cluster: FakeCluster, nth: int, action: Callable[[], None]) -> None:
    """Run ``action`` once, right after the ``nth`` document read from now on (counting only
    the reads of the process under test)."""
    real = cluster.read
    state = {"reads": 0, "inside": False}

    def read() -> DocumentRead:
        result = real()
        if state["inside"]:
            return result
        state["reads"] += 1
        if state["reads"] == nth:
            state["inside"] = True
            action()
        return result

    cluster.read = read  # type: ignore[method-assign]


def _promoted_once(tag: RunTag) -> tuple[RunSession, FakeCluster, str]:
    session, cluster, _head = running_head()
    session.publish_allocation = tag.writer("promotion")
    first = session.submit_successor()
    cluster.run_without_ready(first.job_id)
    start_on_promotion(cluster, first.job_id)
    session.promote_successor()
    assert tag.value == first.job_id
    return session, cluster, first.job_id


def test_a_repeated_promotion_after_a_later_one_keeps_the_later_allocations_tag() -> None:
    tag = RunTag()
    session, cluster, first = _promoted_once(tag)
    second = _promote_next(cluster, tag)
    session.promote_successor()  # this process repeats its promotion: a repair
    assert tag.value == second
    assert ("promotion", first) not in tag.writes[1:]  # never set back


@pytest.mark.parametrize(
    "moment",
    [
        pytest.param(1, id="after-the-repair-read-the-session"),
        pytest.param(2, id="between-the-check-and-the-write"),
    ],
)
def test_a_step_tag_set_while_a_promotion_is_repeated_is_not_overwritten(moment: int) -> None:
    tag = RunTag()
    session, cluster, first = _promoted_once(tag)
    later: dict[str, Any] = {}
    _on_read(cluster, moment, lambda: later.setdefault("job", _promote_next(cluster, tag)))
    session.promote_successor()  # read 1: the repair's view (first is current); read 2: the
    assert tag.value == later["job"]  # check before the write; read 3: the check after it


def test_a_repeated_promotion_still_repairs_a_missing_tag() -> None:
    tag = RunTag()
    session, _cluster, first = _promoted_once(tag)
    tag.value = None  # the publication did not take (Dagster did not answer)
    session.promote_successor()
    assert tag.value == first


def test_promoting_a_successor_drained_before_its_promotion_warns_and_goes_ahead() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.run_without_ready(successor.job_id)

    def start(_files: Any) -> None:  # its step server found the standby's drained file
        def ready() -> None:
            cluster.start(successor.job_id, nodes=("c2",))
            cluster.jobs[successor.job_id].ready = "head=c2\ndrained=USR1\n"
        cluster.clock.at(cluster.clock.t + 2, ready)

    cluster.on_write = start
    lines: list[tuple[str, str]] = []

    class Log:
        def info(self, message: str) -> None:
            lines.append(("info", message))

        def warning(self, message: str) -> None:
            lines.append(("warning", message))

        def error(self, message: str) -> None:
            lines.append(("error", message))

    promoted = session.promote_successor(logger=Log())
    assert promoted.job_id == successor.job_id
    assert cluster.doc()["allocation"]["job_id"] == successor.job_id
    assert head in cluster.cancelled
    warnings = [message for level, message in lines if level == "warning"]
    assert len(warnings) == 1 and f"{successor.job_id} was drained (USR1)" in warnings[0]
    assert "drained outcomes" in warnings[0]
