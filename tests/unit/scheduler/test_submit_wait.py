"""Waiting for a slot under a submission limit, with an injected clock."""

from __future__ import annotations

import pytest

from dagster_slurm.errors import SchedulerError, SubmitLimitReached, SubmitLimitTimeout
from dagster_slurm.scheduler.submit_wait import LimitWait, refusal_error, wait_for_slot
from dagster_slurm.slurm.submit_limits import LimitReading, SubmitRefusal

POLICY = ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
          "(job submit limit, user's size and/or time limits)")
REFUSED = f"sbatch: error: AssocMaxSubmitJobLimit\n{POLICY}"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class RunEnded(Exception):
    pass


def refusal() -> SubmitLimitReached:
    error = refusal_error("job", REFUSED)
    assert isinstance(error, SubmitLimitReached)
    return error


def reading(limit: int = 3) -> tuple[LimitReading, str]:
    return LimitReading(limit, "dev", limit), "dslurm"


def test_submits_once_a_slot_frees_and_says_what_it_waits_for() -> None:
    clock, lines, answers = Clock(), [], [refusal(), refusal(), "job-7"]

    def submit() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    job = wait_for_slot(refusal(), LimitWait(lines.append), submit=submit,
                        read_limit=lambda _r: reading(), what="Slurm job 'a'",
                        clock=clock, sleep=clock.sleep)
    assert job == "job-7"
    assert lines[0] == ("Slurm job 'a': 3 of 3 jobs allowed for user dslurm are queued "
                        "(MaxSubmitJobs of account dev; sbatch: AssocMaxSubmitJobLimit); "
                        "waiting for one to end")
    assert "a slot freed" in lines[-1]


def test_the_timeout_names_the_limit_and_the_field() -> None:
    clock = Clock()

    def submit() -> str:
        raise refusal()

    with pytest.raises(SubmitLimitTimeout) as caught:
        wait_for_slot(refusal(), LimitWait(lambda _l: None, timeout=20.0), submit=submit,
                      read_limit=lambda _r: reading(), what="Slurm job 'a'",
                      clock=clock, sleep=clock.sleep)
    message = str(caught.value)
    assert "MaxSubmitJobs" in message and "submit_limit_timeout=20 s" in message
    assert 20.0 <= clock.now < 25.0


def test_an_ended_run_stops_the_wait_without_submitting() -> None:
    clock, submitted = Clock(), []

    def check() -> None:
        if clock.now >= 3.0:
            raise RunEnded

    with pytest.raises(RunEnded):
        wait_for_slot(refusal(), LimitWait(lambda _l: None, check=check, initial=10.0),
                      submit=lambda: submitted.append(1), read_limit=lambda _r: reading(),
                      what="job", clock=clock, sleep=clock.sleep)
    assert submitted == [] and clock.now < 5.0


def test_a_limit_of_zero_fails_at_once() -> None:
    clock = Clock()
    with pytest.raises(SchedulerError, match="can never be submitted"):
        wait_for_slot(refusal(), LimitWait(lambda _l: None), submit=lambda: "x",
                      read_limit=lambda _r: reading(0), what="job", clock=clock,
                      sleep=clock.sleep)
    assert clock.now == 0.0


def test_hopeless_refusals_are_plain_errors_with_advice() -> None:
    error = refusal_error("a", f"sbatch: error: QOSMaxWallDurationPerJobLimit\n{POLICY}")
    assert not isinstance(error, SubmitLimitReached)
    assert "lower time_limit" in str(error)
    assert isinstance(refusal().refusal, SubmitRefusal)


def test_submit_limit_timeout_is_validated_naming_the_field_and_value() -> None:
    from dagster_slurm.resources.slurm import SlurmResource
    from dagster_slurm.resources.ssh import SSHConnectionResource

    ssh = SSHConnectionResource(host="login.invalid", user="u")
    assert SlurmResource(ssh=ssh).submit_limit_timeout is None
    assert SlurmResource(ssh=ssh, submit_limit_timeout=90).limit_wait(print).timeout == 90
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"submit_limit_timeout={bad}: must be > 0"):
            SlurmResource(ssh=ssh, submit_limit_timeout=bad)
