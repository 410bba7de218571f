"""Reading a start estimate of ``sbatch --test-only`` as epoch seconds (UTC), and the
environment that makes sbatch print UTC."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timezone

import pytest
import slurm_outputs as out

from dagster_slurm.slurm.parsers import parse_test_only as reexported
from dagster_slurm.slurm.test_only import (
    TEST_ONLY_ENV,
    TEST_ONLY_SCRIPT,
    parse_test_only,
    seconds_until_start,
    start_epoch,
    unanswered,
)

# measured on the dev cluster (exit code 0)
MEASURED = ("sbatch: Job 2425 to start at 2026-12-01T21:09:06 using 1 processors on nodes c1 "
            "in partition cpu\n")
MEASURED_EPOCH = datetime(2026, 12, 1, 21, 9, 6, tzinfo=timezone.utc).timestamp()


def test_the_start_is_read_as_utc_epoch_seconds() -> None:
    result = parse_test_only(MEASURED, 0)
    assert start_epoch(result) == MEASURED_EPOCH
    assert (result.partition, result.nodes, result.job_id) == ("cpu", ("c1",), "2425")


@pytest.mark.parametrize(
    ("now", "expected"),
    [(MEASURED_EPOCH - 90.5, 90.5), (MEASURED_EPOCH, 0.0), (MEASURED_EPOCH + 0.7, 0.0),
     (MEASURED_EPOCH + 3600, 0.0)],
)
def test_seconds_until_start_counts_from_now_and_a_due_start_is_zero(now: float,
                                                                     expected: float) -> None:
    assert seconds_until_start(parse_test_only(MEASURED, 0), now) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "code"),
    [(out.TEST_ONLY_BAD_PARTITION, 1), (out.TEST_ONLY_NO_RESOURCES, 1), ("", 0),
     (MEASURED, 1), ("sbatch: Job 7 to start at Tomorrow using 1 processors\n", 0)],
)
def test_no_estimate_means_no_start(text: str, code: int) -> None:
    result = parse_test_only(text, code)
    assert start_epoch(result) is None
    assert seconds_until_start(result, MEASURED_EPOCH) is None


def test_a_rejection_keeps_the_schedulers_message() -> None:
    result = parse_test_only(out.TEST_ONLY_BAD_PARTITION, 1)
    assert result.runnable is False and result.error == "Invalid partition name specified"


def test_unanswered_is_no_verdict_with_the_reason() -> None:
    result = unanswered("sbatch timed out")
    assert result.runnable is None and result.error == "sbatch timed out"
    assert start_epoch(result) is None


def test_the_parser_is_still_importable_from_parsers() -> None:
    assert reexported is parse_test_only


def test_the_script_has_no_sbatch_directives() -> None:
    assert TEST_ONLY_SCRIPT.startswith("#!")
    assert "#SBATCH" not in TEST_ONLY_SCRIPT


@pytest.mark.skipif(shutil.which("date") is None, reason="needs date(1)")
def test_the_environment_makes_local_time_utc_whatever_the_zone() -> None:
    """What sbatch does with the start time (localtime, then the standard format) done by
    date(1) under TEST_ONLY_ENV, from a zone far from UTC."""
    env = {"PATH": "/usr/bin:/bin", "TZ": "America/New_York", **TEST_ONLY_ENV}
    shown = subprocess.run(["date", "-d", f"@{int(MEASURED_EPOCH)}", "+%Y-%m-%dT%H:%M:%S"],
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert shown == "2026-12-01T21:09:06"
