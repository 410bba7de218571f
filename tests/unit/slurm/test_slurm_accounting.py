from __future__ import annotations

from datetime import datetime

import pytest
import slurm_outputs as out

from dagster_slurm.slurm.accounting import SacctRecord, parse_sacct
from dagster_slurm.slurm.states import JobState

K = 1024


def test_measured_output_with_header() -> None:
    records = parse_sacct(out.SACCT_MEASURED)
    assert set(records) == {"4"}
    job = records["4"]
    assert job.state is JobState.COMPLETED
    assert job.elapsed_seconds == 7
    # MaxRSS is empty on the allocation line: the largest step value wins.
    assert job.max_rss_bytes == 322336 * K
    assert job.total_cpu_seconds == pytest.approx(0.963)
    assert [step.step_id for step in job.steps] == ["batch", "0"]
    assert job.steps[1].max_rss_bytes == 218292 * K
    assert job.steps[1].total_cpu_seconds == pytest.approx(0.405)
    # Columns that were not requested stay unknown.
    assert job.exit_code is None and job.alloc_cpus is None and job.cpu_efficiency is None


def test_jobcomp_line_with_explicit_fields() -> None:
    records = parse_sacct(
        out.SACCT_JOBCOMP_LINE, fields=("JobID", "State", "Elapsed", "MaxRSS", "TotalCPU")
    )
    job = records["15"]
    assert job.state is JobState.TIMEOUT
    assert job.elapsed_seconds == 127
    assert job.max_rss_bytes is None
    assert job.total_cpu_seconds is None
    assert job.steps == ()


def test_default_layout() -> None:
    records = parse_sacct(out.SACCT_DEFAULT_LAYOUT)
    assert list(records) == ["4", "16", "17", "18"]

    done = records["4"]
    assert done.name == "py-job"
    assert (done.exit_code, done.exit_signal) == (0, 0)
    assert done.max_rss_bytes == 322336 * K
    assert done.num_nodes == 1
    assert done.nodes == ("c1",)
    assert done.alloc_cpus == 2
    assert done.start_time == datetime(2026, 11, 30, 5, 40, 1)
    assert done.end_time == datetime(2026, 11, 30, 5, 40, 8)
    assert done.cpu_efficiency == pytest.approx(0.963 / (7 * 2))
    assert [step.step_id for step in done.steps] == ["batch", "extern", "0"]

    timed_out = records["16"]
    assert timed_out.state is JobState.TIMEOUT
    assert (timed_out.exit_code, timed_out.exit_signal) == (0, 15)
    assert timed_out.elapsed_seconds == 87
    assert timed_out.nodes == ("c1", "c2")
    assert timed_out.steps[0].state is JobState.CANCELLED

    cancelled = records["17"]
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.raw_state == "CANCELLED by 0"
    assert cancelled.cancelled_by == 0
    assert cancelled.max_rss_bytes == int(1.5 * K**3)

    pending = records["18"]
    assert pending.state is JobState.PENDING
    assert pending.node_list is None
    assert pending.nodes == ()
    assert pending.start_time is None and pending.end_time is None
    assert pending.max_rss_bytes is None
    assert pending.cpu_efficiency is None  # elapsed 0


@pytest.mark.parametrize(
    ("rss", "expected"),
    [
        ("322336K", 322336 * K),
        ("1.5G", int(1.5 * K**3)),
        ("12M", 12 * K**2),
        ("2T", 2 * K**4),
        ("512", 512),
        ("0", 0),
        ("", None),
        ("lots", None),
    ],
)
def test_max_rss_units(rss: str, expected: int | None) -> None:
    line = f"9|j|COMPLETED|0:0|00:00:01|1||00:00:01|1|c1|1|N/A|N/A\n9.batch|batch|COMPLETED|0:0|00:00:01|1|{rss}|00:00:01|1|c1|1|N/A|N/A"
    assert parse_sacct(line)["9"].max_rss_bytes == expected


@pytest.mark.parametrize(
    ("total_cpu", "seconds"),
    [("00:00.963", 0.963), ("1-02:03:04", 93784), ("01:02.500", 62.5), ("12:00:00", 43200)],
)
def test_total_cpu_formats(total_cpu: str, seconds: float) -> None:
    line = f"9|j|COMPLETED|0:0|00:00:01|1||{total_cpu}|1|c1|1|N/A|N/A"
    assert parse_sacct(line)["9"].total_cpu_seconds == pytest.approx(seconds)


def test_total_cpu_falls_back_to_the_sum_of_steps() -> None:
    text = (
        "9|j|COMPLETED|0:0|00:00:10|10|||1|c1|1|N/A|N/A\n"
        "9.batch|batch|COMPLETED|0:0|00:00:10|10||00:02.000|1|c1|1|N/A|N/A\n"
        "9.0|x|COMPLETED|0:0|00:00:05|5||00:03.000|1|c1|1|N/A|N/A\n"
    )
    job = parse_sacct(text)["9"]
    assert job.total_cpu_seconds == pytest.approx(5.0)
    assert job.cpu_efficiency == pytest.approx(0.5)


def test_elapsed_falls_back_to_the_elapsed_text() -> None:
    line = "9|j|RUNNING|0:0|00:01:40|||||c1|1|N/A|N/A"
    assert parse_sacct(line)["9"].elapsed_seconds == 100


def test_steps_without_allocation_line() -> None:
    job = parse_sacct("9.batch|batch|COMPLETED|0:0|00:00:01|1|1K|00:00:01|1|c1|1|N/A|N/A")["9"]
    assert job.state is JobState.UNKNOWN
    assert job.max_rss_bytes == 1024


def test_array_and_het_job_ids() -> None:
    text = (
        "7_3|a|COMPLETED|0:0|00:00:01|1||00:00:01|1|c1|1|N/A|N/A\n"
        "7_3.batch|batch|COMPLETED|0:0|00:00:01|1|2K|00:00:01|1|c1|1|N/A|N/A\n"
        "8+1|h|FAILED|1:0|00:00:01|1||00:00:01|1|c1|1|N/A|N/A\n"
    )
    records = parse_sacct(text)
    assert records["7_3"].max_rss_bytes == 2048
    assert records["8+1"].state is JobState.FAILED
    assert records["8+1"].exit_code == 1


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [
        ("0:15", (0, 15)),
        ("1:0", (1, 0)),
        ("2", (2, None)),
        ("", (None, None)),
        ("x:y", (None, None)),
    ],
)
def test_exit_codes(exit_code: str, expected: tuple[int | None, int | None]) -> None:
    line = f"9|j|FAILED|{exit_code}|00:00:01|1||00:00:01|1|c1|1|N/A|N/A"
    record = parse_sacct(line)["9"]
    assert (record.exit_code, record.exit_signal) == expected


@pytest.mark.parametrize(
    "text",
    ["", out.SACCT_DISABLED, "9|too|few", "JobID|State\n", "|COMPLETED|x|y|z|1|2|3|4|5|6|7|8"],
)
def test_unusable_output(text: str) -> None:
    assert parse_sacct(text) == {}


def test_cpu_efficiency_needs_every_term() -> None:
    base = {
        "job_id": "1",
        "name": None,
        "state": JobState.COMPLETED,
        "raw_state": "COMPLETED",
        "cancelled_by": None,
        "exit_code": 0,
        "exit_signal": 0,
        "elapsed_seconds": 10.0,
        "max_rss_bytes": None,
        "total_cpu_seconds": 15.0,
        "num_nodes": 1,
        "node_list": "c1",
        "nodes": ("c1",),
        "alloc_cpus": 2,
        "start_time": None,
        "end_time": None,
    }
    assert SacctRecord(**base).cpu_efficiency == pytest.approx(0.75)  # type: ignore[arg-type]
    for missing in ("elapsed_seconds", "total_cpu_seconds", "alloc_cpus"):
        assert SacctRecord(**{**base, missing: None}).cpu_efficiency is None  # type: ignore[arg-type]
    assert SacctRecord(**{**base, "alloc_cpus": 0}).cpu_efficiency is None  # type: ignore[arg-type]
