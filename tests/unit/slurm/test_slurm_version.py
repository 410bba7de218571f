"""SlurmVersion: reading ``--version`` lines, ordering, and which release offers what."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagster_slurm.slurm.version import (
    BASELINE,
    SlurmFeature,
    SlurmVersion,
    offers,
    parse_slurm_version,
)

V22_05 = SlurmVersion(22, 5, 8)
V24_11 = SlurmVersion(24, 11, 5)


@pytest.mark.parametrize(("text", "expected"), [
    ("slurm-wlm 22.05.8", SlurmVersion(22, 5, 8)),       # Debian 12, measured
    ("slurm 24.11.5\n", SlurmVersion(24, 11, 5)),          # upstream build
    ("slurm-wlm 24.11.5", SlurmVersion(24, 11, 5)),
    ("slurm 25.05.0-0rc1", SlurmVersion(25, 5, 0)),
    ("slurm 23.11", SlurmVersion(23, 11, 0)),
    ("24.11.5", SlurmVersion(24, 11, 5)),
])
def test_version_lines_are_read(text: str, expected: SlurmVersion) -> None:
    assert parse_slurm_version(text) == expected


@pytest.mark.parametrize("text", [None, 22.05, "", "squeue: command not found",
                                  "slurm 24.13.1", "Python 3.11.2"])
def test_anything_else_is_none(text: object) -> None:
    assert parse_slurm_version(text) is None


@given(st.text())
def test_never_raises(text: str) -> None:
    parse_slurm_version(text)


def test_versions_order_like_releases_and_print_like_slurm() -> None:
    assert SlurmVersion(22, 5, 8) < SlurmVersion(23, 2, 0) < SlurmVersion(23, 11, 4)
    assert SlurmVersion(23, 11, 4) < SlurmVersion(23, 11, 5) < V24_11 < SlurmVersion(26, 5, 0)
    assert str(V22_05) == "22.05.8" and str(V24_11) == "24.11.5" and V24_11.series == "24.11"
    assert BASELINE == SlurmVersion(22, 5, 0)


@pytest.mark.parametrize(("version", "expected"), [
    (V22_05, False),
    (SlurmVersion(23, 2, 7), False),
    (SlurmVersion(23, 11, 4), False),     # added in 23.11.5
    (SlurmVersion(23, 11, 5), True),
    (V24_11, True),
    (SlurmVersion(25, 11, 2), True),
    (SlurmVersion(26, 5, 0), False),      # the job state cache is gone
    (None, False),
])
def test_only_job_state_between_23_11_5_and_26_05(version: SlurmVersion | None,
                                                  expected: bool) -> None:
    assert offers(version, SlurmFeature.ONLY_JOB_STATE) is expected


def test_sacct_planned_from_23_02() -> None:
    assert not V22_05.offers(SlurmFeature.SACCT_PLANNED)
    assert SlurmVersion(23, 2, 0).offers(SlurmFeature.SACCT_PLANNED)
    assert V24_11.offers(SlurmFeature.SACCT_PLANNED)
    assert not offers(None, SlurmFeature.SACCT_PLANNED)


def test_the_agent_asks_the_same_command() -> None:
    from dagster_slurm.agent.remote.protocol import SLURM_VERSION_ARGV
    from dagster_slurm.slurm.version import VERSION_ARGV

    assert SLURM_VERSION_ARGV == list(VERSION_ARGV)
