"""Results and typed failures of steps inside a run allocation."""

from __future__ import annotations

import dataclasses

import pytest

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.errors import SlurmJobError
from dagster_slurm.session.core.errors import (
    REPLACED,
    SessionError,
    SlurmAllocationEnded,
    SlurmStepDrained,
    SlurmStepExecutionResult,
    SlurmStepFailed,
)


def test_result_defaults_and_outcome() -> None:
    result = SlurmStepExecutionResult("42", "step_a", 0)
    assert (result.drained, result.drain_signal, result.allocation_state) == (False, None, None)
    outcome = result.outcome()
    assert (outcome.job_id, outcome.state, outcome.exit_code) == ("42", "RUNNING", 0)
    ended = SlurmStepExecutionResult("42", "step_a", None, allocation_state="TIMEOUT",
                                     stdout_tail="out", stderr_tail="err")
    outcome = ended.outcome()
    assert (outcome.state, outcome.exit_code) == ("TIMEOUT", None)
    assert (outcome.stdout_tail, outcome.stderr_tail) == ("out", "err")


def test_result_is_immutable() -> None:
    result = SlurmStepExecutionResult("42", "s", 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.exit_code = 1  # type: ignore[misc]


def test_allocation_ended_carries_the_result_and_says_what_happened() -> None:
    result = SlurmStepExecutionResult("42", "step_a", None, allocation_state="TIMEOUT",
                                      stderr_tail="Killed\n")
    error = SlurmAllocationEnded(result, "allocation 42 ended (TIMEOUT) before the step wrote")
    assert error.result is result
    assert error.result.allocation_state == "TIMEOUT"
    assert isinstance(error, SlurmJobError) and isinstance(error, DagsterSlurmError)
    assert error.outcome.state == "TIMEOUT"
    message = str(error)
    assert message.startswith("the run allocation ended under the step (job 42, state TIMEOUT)")
    assert "exit code" not in message.splitlines()[0]  # none was written
    assert "allocation 42 ended (TIMEOUT) before the step wrote" in message
    assert "stderr (last lines):\nKilled" in message


def test_allocation_replaced_before_the_step_started() -> None:
    result = SlurmStepExecutionResult("42", "step_a", None, allocation_state=REPLACED)
    error = SlurmAllocationEnded(result, "prepare the step again")
    assert REPLACED == "REPLACED"
    assert error.result.allocation_state == "REPLACED"
    assert "state REPLACED" in str(error) and "prepare the step again" in str(error)


def test_allocation_ended_with_a_drained_result_keeps_the_signal() -> None:
    result = SlurmStepExecutionResult("42", "s", None, True, "USR1", allocation_state="CANCELLED")
    error = SlurmAllocationEnded(result)
    assert error.result.drained and error.result.drain_signal == "USR1"
    assert str(error) == "the run allocation ended under the step (job 42, state CANCELLED)"


def test_step_failed_names_the_exit_code_and_the_tails() -> None:
    result = SlurmStepExecutionResult("42", "step_a", 3, stdout_tail="last out\n",
                                      stderr_tail="Traceback ...\n")
    error = SlurmStepFailed(result, "files kept in /x")
    assert error.result is result
    assert isinstance(error, SlurmJobError)
    message = str(error)
    assert "payload exited with a non-zero code" in message
    assert "job 42" in message and "exit code 3" in message
    assert "files kept in /x" in message
    assert "Traceback ..." in message and "last out" in message


def test_step_drained_has_result_and_invocation() -> None:
    result = SlurmStepExecutionResult("42", "step_a", 0, True, "USR1")
    invocation = object()
    error = SlurmStepDrained(result, invocation)
    assert error.result is result
    assert error.invocation is invocation
    assert isinstance(error, DagsterSlurmError)
    assert not isinstance(error, SlurmJobError)  # not a failure of the job
    message = str(error)
    assert "step step_a in allocation 42 was drained" in message
    assert "signal USR1" in message and "exit code 0" in message
    assert "whether work remains" in message


def test_session_error_is_a_library_error() -> None:
    assert issubclass(SessionError, DagsterSlurmError)
    assert not issubclass(SessionError, SlurmJobError)
