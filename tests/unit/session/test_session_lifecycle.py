"""Teardown of run sessions: whether the run is over, and what close() is asked to do."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import dagster as dg
import pytest
from session_fakes import Lines

from dagster_slurm.session.frontend import lifecycle
from dagster_slurm.session.frontend.lifecycle import (
    close_run_sessions,
    run_id_of,
    run_is_over,
    session_for,
    sessions_of_run,
)

# -- run_is_over with a real instance -----------------------------------------------------------


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def test_no_instance_or_no_run_means_over() -> None:
    assert run_is_over(None, "some-run") == (True, "no Dagster run to consult")
    over, why = run_is_over(object(), None)
    assert over and "no Dagster run" in why


def test_unknown_run_means_over(instance: dg.DagsterInstance) -> None:
    over, why = run_is_over(instance, "0" * 36)
    assert over and "unknown" in why


def test_finished_run_is_over_and_running_steps_are_not(instance: dg.DagsterInstance) -> None:
    seen: dict[str, tuple[bool, str]] = {}

    @dg.asset
    def first(context):  # unannotated: dagster reads annotations
        seen["first"] = run_is_over(context.instance, context.run.run_id)
        seen["run_id_of"] = (run_id_of(context) == context.run.run_id, "")
        return 1

    @dg.asset
    def second(context, first):
        seen["second"] = run_is_over(context.instance, context.run.run_id)
        return first + 1

    result = dg.materialize([first, second], instance=instance)
    assert result.success
    # while the run executes, the steps still to come keep it going
    assert seen["first"] == (False, "2 step(s) of the run have not finished")
    assert seen["second"] == (False, "1 step(s) of the run have not finished")
    assert seen["run_id_of"][0]
    over, why = run_is_over(instance, result.run_id)
    assert over and "SUCCESS" in why


def test_failed_run_is_over(instance: dg.DagsterInstance) -> None:
    @dg.asset
    def broken() -> None:
        raise RuntimeError("boom")

    result = dg.materialize([broken], instance=instance, raise_on_error=False)
    assert not result.success
    over, why = run_is_over(instance, result.run_id)
    assert over and "FAILURE" in why


_TEARDOWNS: list[tuple[bool, str]] = []


class _Probe(dg.ConfigurableResource):
    """Records what run_is_over says when Dagster tears the resource down."""

    def teardown_after_execution(self, context) -> None:
        _TEARDOWNS.append(run_is_over(context.instance, run_id_of(context)))


@dg.asset
def _upstream(probe: _Probe) -> None:
    raise RuntimeError("boom")


@dg.asset(deps=[_upstream])
def _downstream(probe: _Probe) -> None:
    return None


@dg.asset
def _alone(probe: _Probe) -> None:
    return None


def test_teardown_after_a_successful_in_process_run_sees_the_run_over(
    instance: dg.DagsterInstance,
) -> None:
    _TEARDOWNS.clear()
    assert dg.materialize([_alone], resources={"probe": _Probe()}, instance=instance).success
    assert _TEARDOWNS == [(True, "every step of the run has finished")]


def test_teardown_after_an_upstream_failure_sees_the_run_over(
    instance: dg.DagsterInstance,
) -> None:
    _TEARDOWNS.clear()
    result = dg.materialize([_upstream, _downstream], resources={"probe": _Probe()},
                            instance=instance, raise_on_error=False)
    assert not result.success
    # the in-process executor tears the resource down once, when no step is left to run
    assert len(_TEARDOWNS) == 1
    assert _TEARDOWNS[0][0], _TEARDOWNS[0][1]


# -- run_is_over with a fake instance -----------------------------------------------------------


def _status(value: str) -> SimpleNamespace:
    return SimpleNamespace(value=value)


class FakeInstance:
    def __init__(self, run_status: str, planned: list[str], step_statuses: dict[str, str],
                 *, to_execute: list[str] | None = None, fail: bool = False) -> None:
        self.run = SimpleNamespace(status=_status(run_status), execution_plan_snapshot_id="snap-1")
        self.snapshot = SimpleNamespace(
            step_keys_to_execute=to_execute,
            steps=[SimpleNamespace(key=key) for key in planned],
        )
        self.stats = [SimpleNamespace(step_key=k, status=_status(v)) for k, v in step_statuses.items()]
        self.fail = fail

    def get_run_by_id(self, run_id: str) -> Any:
        if self.fail:
            raise RuntimeError("storage unavailable")
        return self.run

    def get_execution_plan_snapshot(self, snapshot_id: str) -> Any:
        assert snapshot_id == "snap-1"
        return self.snapshot

    def get_run_step_stats(self, run_id: str) -> list[Any]:
        return self.stats


@pytest.mark.parametrize("status", ["SUCCESS", "FAILURE", "CANCELING", "CANCELED"])
def test_final_run_status_is_over(status: str) -> None:
    over, why = run_is_over(FakeInstance(status, ["a", "b"], {}), "r")
    assert over and status in why


def test_unfinished_steps_keep_the_run_going() -> None:
    inst = FakeInstance("STARTED", ["a", "b", "c"], {"a": "SUCCESS", "b": "IN_PROGRESS"})
    over, why = run_is_over(inst, "r")
    assert not over
    assert why == "2 step(s) of the run have not finished"


def test_every_planned_step_finished_is_over() -> None:
    inst = FakeInstance("STARTED", ["a", "b", "c"],
                        {"a": "SUCCESS", "b": "FAILURE", "c": "SKIPPED"})
    over, why = run_is_over(inst, "r")
    assert over and "every step" in why


def test_step_keys_to_execute_narrow_the_plan() -> None:
    inst = FakeInstance("STARTED", ["a", "b", "c"], {"b": "SUCCESS"}, to_execute=["b"])
    assert run_is_over(inst, "r")[0]
    inst = FakeInstance("STARTED", ["a", "b", "c"], {"b": "SUCCESS"}, to_execute=["b", "c"])
    assert run_is_over(inst, "r") == (False, "1 step(s) of the run have not finished")


def test_a_step_up_for_retry_is_not_finished() -> None:
    inst = FakeInstance("STARTED", ["a"], {"a": "UP_FOR_RETRY"})
    assert not run_is_over(inst, "r")[0]


def test_unreadable_run_state_is_unknown_not_over() -> None:
    over, why = run_is_over(FakeInstance("STARTED", ["a"], {}, fail=True), "r")
    assert over is None
    assert "could not be read" in why and "storage unavailable" in why


# -- run_id_of ---------------------------------------------------------------------------------


class _RunRaises:
    run_id = "from-attribute"

    @property
    def run(self) -> Any:
        raise RuntimeError("no run here")


def test_run_id_of_resource_and_execution_contexts() -> None:
    run = SimpleNamespace(run_id="r-1")
    assert run_id_of(SimpleNamespace(run=run, run_id="ignored")) == "r-1"
    assert run_id_of(SimpleNamespace(run_id="r-2")) == "r-2"
    assert run_id_of(_RunRaises()) == "from-attribute"
    assert run_id_of(SimpleNamespace(run=None, run_id=None)) is None
    assert run_id_of(dg.build_init_resource_context()) is None


# -- close_run_sessions ---------------------------------------------------------------------------


class FakeSession:
    def __init__(self, run_id: str, *, interrupted: bool = False) -> None:
        self.run_id = run_id
        self.interrupted = interrupted
        self.job_name = f"dsr-{run_id}-abcd1234"
        self.config = SimpleNamespace(heartbeat_timeout=600.0)
        self.closed: list[dict[str, Any]] = []

    def close(self, *, cancel: bool, reason: str = "", logger: Any = None) -> None:
        self.closed.append({"cancel": cancel, "reason": reason, "logger": logger})


@pytest.fixture
def run_id() -> Iterator[str]:
    run = f"run-{uuid.uuid4()}"
    yield run
    sessions_of_run(run)  # leave the process registry clean


def _register(run_id: str, key: str, **kwargs: Any) -> FakeSession:
    session = FakeSession(run_id, **kwargs)
    assert session_for(key, lambda: session) is session  # type: ignore[arg-type,return-value]
    return session


def _context(run_id: str | None, instance: Any = None, log: Any = None) -> SimpleNamespace:
    """What a resource's teardown gets (an InitResourceContext has both run and dagster_run)."""
    run = SimpleNamespace(run_id=run_id)
    return SimpleNamespace(run=run, dagster_run=run, instance=instance, log=log)


def test_session_for_creates_once_per_key(run_id: str) -> None:
    calls: list[int] = []

    def factory() -> FakeSession:
        calls.append(1)
        return FakeSession(run_id)

    first = session_for(f"{run_id}|a", factory)  # type: ignore[arg-type]
    assert session_for(f"{run_id}|a", factory) is first  # type: ignore[arg-type]
    other = session_for(f"{run_id}|b", factory)  # type: ignore[arg-type]
    assert other is not first and len(calls) == 2
    assert sorted(map(id, sessions_of_run(run_id))) == sorted([id(first), id(other)])
    assert sessions_of_run(run_id) == []  # removed from the registry


def test_interrupted_session_is_cancelled_even_when_the_run_goes_on(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k", interrupted=True)
    still_running = FakeInstance("STARTED", ["a", "b"], {"a": "SUCCESS"})
    log = Lines()
    close_run_sessions(_context(run_id, still_running, log))
    assert session.closed == [{"cancel": True, "reason": "the step was interrupted", "logger": log}]


def test_session_is_cancelled_when_the_run_is_over(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k")
    done = FakeInstance("STARTED", ["a"], {"a": "SUCCESS"})
    log = Lines()
    close_run_sessions(_context(run_id, done, log))
    assert len(session.closed) == 1
    assert session.closed[0]["cancel"] is True
    assert "every step" in session.closed[0]["reason"]
    assert session.closed[0]["logger"] is log


def test_without_instance_the_session_is_cancelled(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k")
    close_run_sessions(_context(run_id))
    assert [c["cancel"] for c in session.closed] == [True]


def test_session_is_kept_while_the_run_goes_on(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k")
    running = FakeInstance("STARTED", ["a", "b"], {"a": "SUCCESS"})
    log = Lines()
    close_run_sessions(_context(run_id, running, log))
    assert [c["cancel"] for c in session.closed] == [False]
    (level, message), = log.lines
    assert level == "info"
    assert session.job_name in message and "600.0 s" in message
    assert "1 step(s)" in message


def test_unknown_run_state_keeps_the_allocation_and_says_why(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k")
    log = Lines()
    close_run_sessions(_context(run_id, FakeInstance("STARTED", ["a"], {}, fail=True), log))
    assert [c["cancel"] for c in session.closed] == [False]  # heartbeat stopped, job kept
    (level, message), = log.lines
    assert level == "warning"
    assert session.job_name in message and "unknown" in message
    assert "storage unavailable" in message and "600.0 s after the last heartbeat" in message


def test_unknown_run_state_without_dead_mans_switch_says_it_needs_scancel(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k")
    session.config = SimpleNamespace(heartbeat_timeout=None)
    log = Lines()
    close_run_sessions(_context(run_id, FakeInstance("STARTED", ["a"], {}, fail=True), log))
    assert [c["cancel"] for c in session.closed] == [False]
    assert "scancel" in log.lines[0][1] and "heartbeat_timeout=None" in log.lines[0][1]


def test_each_session_is_closed_once_and_other_runs_are_untouched(run_id: str) -> None:
    mine = [_register(run_id, f"{run_id}|a"), _register(run_id, f"{run_id}|b")]
    other_run = f"{run_id}-other"
    theirs = _register(other_run, f"{other_run}|a")
    try:
        close_run_sessions(_context(run_id))
        close_run_sessions(_context(run_id))  # a second teardown finds nothing left
        assert [len(s.closed) for s in mine] == [1, 1]
        assert theirs.closed == []
    finally:
        sessions_of_run(other_run)


def test_run_id_may_come_from_the_context(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k")
    close_run_sessions(SimpleNamespace(run_id=run_id, instance=None, log=None))
    assert [c["cancel"] for c in session.closed] == [True]


def test_no_run_id_closes_nothing(run_id: str) -> None:
    session = _register(run_id, f"{run_id}|k")
    close_run_sessions(SimpleNamespace(run=None, dagster_run=None, instance=None, log=None))
    assert session.closed == []
    assert sessions_of_run(run_id) == [session]


def test_registry_is_per_process(run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    session = _register(run_id, f"{run_id}|k")
    monkeypatch.setattr(lifecycle.os, "getpid", lambda: -1)
    # a forked step process does not see (or close) its parent's sessions
    assert sessions_of_run(run_id) == []
    fresh = session_for(f"{run_id}|k", lambda: FakeSession(run_id))  # type: ignore[arg-type,return-value]
    assert fresh is not session
    assert sessions_of_run(run_id) == [fresh]
    monkeypatch.undo()
    assert sessions_of_run(run_id) == [session]
