from __future__ import annotations

import math

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.walltime import format_walltime, parse_duration, validate_walltime


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        # the sbatch --time formats
        ("10", 600),  # minutes
        ("0", 0),
        ("90", 5400),
        ("1:30", 90),  # minutes:seconds
        ("01:02:03", 3723),  # hours:minutes:seconds
        ("48:00:00", 172800),  # leading field is unbounded
        ("2-3", 2 * 86400 + 3 * 3600),  # days-hours
        ("2-03:04", 2 * 86400 + 3 * 3600 + 4 * 60),  # days-hours:minutes
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),  # days-hours:minutes:seconds
        # measured squeue values
        ("2:58", 178),
        ("3:00", 180),
        ("0:02", 2),
        ("1-00:00:00", 86400),
        # measured sacct values
        ("00:00:07", 7),
        ("00:01:27", 87),
        ("00:00.963", 0.963),
        ("1-02:03:04", 93784),
        ("  5  ", 300),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["UNLIMITED", "INFINITE", "unlimited"])
def test_unlimited_is_infinite(text: str) -> None:
    assert parse_duration(text) == math.inf


@pytest.mark.parametrize(
    "text",
    [
        "",
        "INVALID",  # measured squeue %L once a job overran its limit
        "N/A",
        "NOT_SET",
        "Partition_Limit",
        "-5",
        "-00:01:00",
        "1:60",
        "1:60:00",
        "1:00:60",
        "1-24",
        "1-2:3:4:5",
        "1.5",
        "abc",
        "1:",
        ":1",
        "١٢",  # non-ASCII digits
        "9" * 40,  # longer than any sane duration
    ],
)
def test_unreadable_durations_are_none(text: str) -> None:
    assert parse_duration(text) is None


def test_non_strings_are_none() -> None:
    assert parse_duration(None) is None
    assert parse_duration(60) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "00:00:00"),
        (59, "00:00:59"),
        (3600, "01:00:00"),
        (86399, "23:59:59"),
        (86400, "1-00:00:00"),
        (93784, "1-02:03:04"),
        (30 * 86400, "30-00:00:00"),
        (0.2, "00:00:01"),  # rounded up, never shorter than asked
        (math.inf, "UNLIMITED"),
    ],
)
def test_format_walltime(seconds: float, text: str) -> None:
    assert format_walltime(seconds) == text


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan])
def test_format_walltime_rejects_negative_and_nan(bad: float) -> None:
    with pytest.raises(ValueError):
        format_walltime(bad)


def test_format_walltime_rejects_non_numbers() -> None:
    with pytest.raises(TypeError):
        format_walltime("60")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        format_walltime(True)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        ("10", "00:10:00"),
        ("01:00:00", "01:00:00"),
        ("1-0", "1-00:00:00"),
        ("3-00:00:00", "3-00:00:00"),
        ("UNLIMITED", "UNLIMITED"),
        ("infinite", "UNLIMITED"),
    ],
)
def test_validate_walltime_returns_canonical_text(value: str, canonical: str) -> None:
    assert validate_walltime("time_limit", value) == canonical


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "must be positive"),
        ("00:00:00", "must be positive"),
        ("-10", "must not be negative"),
        ("soon", "is not a Slurm time"),
        ("1:75", "is not a Slurm time"),
        ("00:00:30.5", "fractions"),
        (600, "must be a Slurm time string"),
        (None, "must be a Slurm time string"),
    ],
)
def test_validate_walltime_rejects(value: object, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as caught:
        validate_walltime("time_limit", value)
    assert caught.value.field == "time_limit"
    assert caught.value.value == value
    assert str(caught.value).startswith(f"time_limit={value!r}")
