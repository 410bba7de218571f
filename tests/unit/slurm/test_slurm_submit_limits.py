"""Classifying sbatch's limit refusals and reading the limit, with texts of Slurm 22.05."""

from __future__ import annotations

import pytest

from dagster_slurm.slurm.submit_limits import (
    LimitScope,
    RefusalKind,
    classify_refusal,
    describe_wait,
    never_fits,
    parse_limits,
    parse_queued,
)

POLICY = ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
          "(job submit limit, user's size and/or time limits)")


def refused(code: str) -> str:
    """sbatch's stderr as printed on the development cluster (Slurm 22.05.8)."""
    return f"sbatch: error: {code}\n{POLICY}\n"


@pytest.mark.parametrize(("code", "scope"), [
    ("AssocMaxSubmitJobLimit", LimitScope.ASSOCIATION_USER),
    ("AssocGrpSubmitJobsLimit", LimitScope.ASSOCIATION_GROUP),
    ("QOSMaxSubmitJobPerUserLimit", LimitScope.QOS_USER),
    ("MaxSubmitJobsPerAccount", LimitScope.QOS_ACCOUNT),
    ("QOSGrpSubmitJobsLimit", LimitScope.QOS_GROUP),
])
def test_count_limits_are_waited_for(code: str, scope: LimitScope) -> None:
    refusal = classify_refusal(refused(code))
    assert refusal is not None
    assert (refusal.kind, refusal.scope, refusal.code) == (RefusalKind.WAIT, scope, code)


@pytest.mark.parametrize(("code", "words"), [
    ("QOSMaxWallDurationPerJobLimit", "time_limit"),
    ("QOSMaxCpuPerUserLimit", "CPU"),
    ("AssocMaxNodePerJobLimit", "num_nodes"),
])
def test_size_limits_are_hopeless_with_advice(code: str, words: str) -> None:
    refusal = classify_refusal(refused(code))
    assert refusal is not None and refusal.kind is RefusalKind.HOPELESS
    assert refusal.advice is not None and words in refusal.advice


def test_a_policy_refusal_without_a_known_code_is_hopeless() -> None:
    refusal = classify_refusal(POLICY)
    assert refusal is not None and refusal.kind is RefusalKind.HOPELESS


@pytest.mark.parametrize("text", [
    "sbatch: error: Batch job submission failed: Invalid qos specification",
    "sbatch: error: invalid partition specified: nosuch\n"
    "sbatch: error: Batch job submission failed: Invalid partition name specified",
    "",
])
def test_other_failures_are_not_limit_refusals(text: str) -> None:
    assert classify_refusal(text) is None


ASSOCS = """root||||normal|
root|root|||normal|
dagster-slurm||||normal|
dagster-slurm|dslurm|3||lim,normal|
dagster-slurm|dslurm2|||normal|
"""
QOS = "normal|||\nlim|2||\n"
QUEUE = "dslurm|dagster-slurm|normal\ndslurm|dagster-slurm|normal\ndslurm|dagster-slurm|lim\n"


def test_association_limit_and_queued_count() -> None:
    refusal = classify_refusal(refused("AssocMaxSubmitJobLimit"))
    assert refusal is not None
    reading = parse_limits(refusal, user="dslurm", associations=ASSOCS, qos=QOS, queue=QUEUE)
    assert (reading.limit, reading.holder, reading.queued) == (3, "dagster-slurm", 3)
    line = describe_wait(refusal, reading, "dslurm")
    assert line.startswith("3 of 3 jobs allowed for user dslurm are queued")
    assert "MaxSubmitJobs of account dagster-slurm" in line and "waiting for one to end" in line


def test_qos_limit_of_the_job_qos() -> None:
    refusal = classify_refusal(refused("QOSMaxSubmitJobPerUserLimit"))
    assert refusal is not None
    reading = parse_limits(refusal, user="dslurm", associations=ASSOCS, qos=QOS, queue=QUEUE,
                           job_qos="lim")
    assert (reading.limit, reading.holder, reading.queued) == (2, "lim", 1)
    assert "in QOS lim" in describe_wait(refusal, reading, "dslurm")


def test_a_limit_that_cannot_be_found_is_said_plainly() -> None:
    refusal = classify_refusal(refused("AssocMaxSubmitJobLimit"))
    assert refusal is not None
    reading = parse_limits(refusal, user="someone", associations=ASSOCS, qos=QOS, queue="")
    assert reading.limit is None and reading.problem
    line = describe_wait(refusal, reading, "someone")
    assert "could not be read" in line and "AssocMaxSubmitJobLimit" in line
    assert "could not be read" in describe_wait(refusal, None, "someone")


def test_a_limit_of_zero_never_fits() -> None:
    refusal = classify_refusal(refused("AssocMaxSubmitJobLimit"))
    assert refusal is not None
    reading = parse_limits(refusal, user="dslurm", associations=ASSOCS.replace("|3|", "|0|"),
                           qos=QOS, queue="")
    assert never_fits(reading)


def test_queued_jobs_of_other_users_do_not_count() -> None:
    queued = parse_queued(QUEUE + "other|dagster-slurm|normal\n", "dslurm")
    assert queued.total == 3 and queued.by_qos == {"normal": 2, "lim": 1}


def test_the_code_is_found_after_words_the_caller_put_before_it() -> None:
    text = "SubmitFailed: failed: " + refused("QOSMaxSubmitJobPerUserLimit")
    refusal = classify_refusal(text)
    assert refusal is not None and refusal.scope is LimitScope.QOS_USER


def test_a_shared_limit_says_how_many_of_the_jobs_are_the_users() -> None:
    refusal = classify_refusal(refused("AssocGrpSubmitJobsLimit"))
    assert refusal is not None
    assocs = ASSOCS.replace("dagster-slurm||||normal|", "dagster-slurm|||5|normal|")
    reading = parse_limits(refusal, user="dslurm", associations=assocs, qos=QOS, queue=QUEUE)
    assert (reading.limit, reading.holder, reading.queued) == (5, "dagster-slurm", 3)
    assert describe_wait(refusal, reading, "dslurm").startswith(
        "the 5 jobs allowed for account dagster-slurm (all its users) are queued, 3 of them yours")
