from __future__ import annotations

import pytest

from dagster_slurm.slurm.states import (
    ACTIVE_STATES,
    FAILURE_STATES,
    PENDING_STATES,
    STATE_CODES,
    TERMINAL_STATES,
    JobState,
    cancelled_by,
)

EXPECTED_CODES = {
    "PD": JobState.PENDING,
    "R": JobState.RUNNING,
    "S": JobState.SUSPENDED,
    "CG": JobState.COMPLETING,
    "CD": JobState.COMPLETED,
    "CA": JobState.CANCELLED,
    "F": JobState.FAILED,
    "TO": JobState.TIMEOUT,
    "NF": JobState.NODE_FAIL,
    "PR": JobState.PREEMPTED,
    "BF": JobState.BOOT_FAIL,
    "DL": JobState.DEADLINE,
    "OOM": JobState.OUT_OF_MEMORY,
    "CF": JobState.CONFIGURING,
    "RQ": JobState.REQUEUED,
    "RF": JobState.REQUEUE_FED,
    "RH": JobState.REQUEUE_HOLD,
    "RS": JobState.RESIZING,
    "RV": JobState.REVOKED,
    "SI": JobState.SIGNALING,
    "SE": JobState.SPECIAL_EXIT,
    "SO": JobState.STAGE_OUT,
    "ST": JobState.STOPPED,
    "RD": JobState.RESV_DEL_HOLD,
}


def test_every_slurm_state_has_a_member_and_a_code() -> None:
    slurm_states = set(JobState) - {JobState.UNKNOWN}
    assert len(slurm_states) == 24
    assert set(STATE_CODES) == slurm_states
    assert set(EXPECTED_CODES.values()) == slurm_states


@pytest.mark.parametrize("state", [s for s in JobState if s is not JobState.UNKNOWN])
def test_long_names_parse_to_themselves(state: JobState) -> None:
    assert JobState.parse(state.value) is state
    assert JobState.parse(f"  {state.value.lower()}\n") is state


@pytest.mark.parametrize(("code", "state"), sorted(EXPECTED_CODES.items()))
def test_compact_codes(code: str, state: JobState) -> None:
    assert JobState.parse(code) is state


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("CANCELLED by 0", JobState.CANCELLED),  # measured sacct text
        ("CANCELLED by 1000", JobState.CANCELLED),
        ("CANCELLED+", JobState.CANCELLED),
        ("CANCELLED by 1000+", JobState.CANCELLED),
        ("COMPLETED+", JobState.COMPLETED),
        ("TIMEOUT", JobState.TIMEOUT),
    ],
)
def test_sacct_decorations(text: str, state: JobState) -> None:
    assert JobState.parse(text) is state


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "RUN",  # a prefix of RUNNING: never guessed
        "RUNNINGX",
        "RUNNING garbage",
        "CANCELLED by",
        "CANCELLED by root",
        "COMPLETED++",
        "P",
        "UNKNOWN",
        "N/A",
        "+",
    ],
)
def test_unreadable_text_is_unknown(text: str) -> None:
    assert JobState.parse(text) is JobState.UNKNOWN


def test_non_strings_are_unknown() -> None:
    assert JobState.parse(None) is JobState.UNKNOWN
    assert JobState.parse(3) is JobState.UNKNOWN


def test_cancelled_by_uid() -> None:
    assert cancelled_by("CANCELLED by 0") == 0
    assert cancelled_by("CANCELLED by 1000") == 1000
    assert cancelled_by("CANCELLED") is None
    assert cancelled_by("FAILED") is None
    assert cancelled_by(None) is None


def test_groups_partition_the_slurm_states() -> None:
    slurm_states = set(JobState) - {JobState.UNKNOWN}
    assert ACTIVE_STATES.isdisjoint(TERMINAL_STATES)
    assert ACTIVE_STATES | TERMINAL_STATES == slurm_states
    assert PENDING_STATES <= ACTIVE_STATES
    assert FAILURE_STATES == TERMINAL_STATES - {JobState.COMPLETED}


def test_unknown_belongs_to_no_group() -> None:
    unknown = JobState.UNKNOWN
    assert not (unknown.terminal or unknown.active or unknown.pending or unknown.failed)


@pytest.mark.parametrize(
    ("state", "terminal", "active", "pending", "failed"),
    [
        (JobState.PENDING, False, True, True, False),
        (JobState.RUNNING, False, True, False, False),
        (JobState.COMPLETING, False, True, False, False),
        (JobState.SUSPENDED, False, True, False, False),
        (JobState.REQUEUED, False, True, True, False),
        (JobState.COMPLETED, True, False, False, False),
        (JobState.CANCELLED, True, False, False, True),
        (JobState.TIMEOUT, True, False, False, True),
        (JobState.OUT_OF_MEMORY, True, False, False, True),
    ],
)
def test_properties(
    state: JobState, terminal: bool, active: bool, pending: bool, failed: bool
) -> None:
    assert (state.terminal, state.active, state.pending, state.failed) == (
        terminal,
        active,
        pending,
        failed,
    )
