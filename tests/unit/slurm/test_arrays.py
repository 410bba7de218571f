"""Job arrays in the Slurm layer: the ``--array`` value, the site's limit, the split of a
run into arrays, and what squeue and sacct say of each task."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.arrays import (
    DEFAULT_MAX_ARRAY_SIZE,
    ArrayChunk,
    array_expression,
    fold_array_accounting,
    fold_array_queue,
    max_array_size,
    parse_array_expression,
    pending_range_of,
    split_for_arrays,
    task_index_of,
    validate_array_expression,
    validate_array_parallelism,
)
from dagster_slurm.slurm.commands import SACCT_FIELDS, SbatchSpec, sbatch_argv
from dagster_slurm.slurm.hetjob import HetComponentSpec
from dagster_slurm.slurm.parsers import parse_scontrol_config, parse_squeue
from dagster_slurm.slurm.states import JobState

GOLDEN = Path(__file__).parent / "golden"


def _error(call: Callable[..., object], *args: object) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        call(*args)
    return caught.value


# --- array_expression and its inverse --------------------------------------------------


@pytest.mark.parametrize(
    ("indices", "parallelism", "expected"),
    [
        ([0, 1, 2, 3, 4, 7, 9, 10, 11, 12], None, "0-4,7,9-12"),
        ([12, 9, 7, 4, 3, 2, 1, 0, 11, 10, 7, 0], None, "0-4,7,9-12"),
        ([5], None, "5"),
        ([5], 1, "5%1"),
        (range(200), 20, "0-199%20"),
        ([1, 3, 5], None, "1,3,5"),
        ((i for i in (2, 3)), 7, "2-3%7"),
    ],
)
def test_array_expression(indices: Iterable[int], parallelism: int | None,
                          expected: str) -> None:
    assert array_expression(indices, parallelism) == expected


def test_array_expression_refuses_no_indices() -> None:
    error = _error(array_expression, [])
    assert error.field == "indices"
    assert "at least one task" in str(error)


def test_array_expression_refuses_a_negative_index() -> None:
    error = _error(array_expression, [3, -2, 5])
    assert (error.field, error.value) == ("indices", -2)
    assert str(error).startswith("indices=-2: ")
    assert "negative" in str(error)


@pytest.mark.parametrize("parallelism", [0, -1, True, 2.5, "3"])
def test_array_expression_refuses_a_bad_parallelism(parallelism: object) -> None:
    error = _error(array_expression, [0, 1], parallelism)
    assert (error.field, error.value) == ("array_parallelism", parallelism)
    assert "array_parallelism=" in str(error)


@pytest.mark.parametrize(
    ("text", "indices", "throttle"),
    [
        ("0-4,7,9-12", {0, 1, 2, 3, 4, 7, 9, 10, 11, 12}, None),
        ("5-9,12%4", {5, 6, 7, 8, 9, 12}, 4),  # inside squeue's brackets: 123_[5-9,12%4]
        ("5-999%10", set(range(5, 1000)), 10),
        ("5,7-9", {5, 7, 8, 9}, None),
        ("3", {3}, None),
        ("3-3", {3}, None),
        ("4,2,2", {2, 4}, None),
        (" 0-2 ", {0, 1, 2}, None),
    ],
)
def test_parse_array_expression(text: str, indices: set[int], throttle: int | None) -> None:
    assert parse_array_expression(text) == (frozenset(indices), throttle)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "task indices and ranges"),
        ("1-", "task indices and ranges"),
        ("-1", "task indices and ranges"),
        ("1,,2", "task indices and ranges"),
        ("1-2-3", "task indices and ranges"),
        ("0-15:4", "task indices and ranges"),
        ("a", "task indices and ranges"),
        ("\u0663", "task indices and ranges"),  # a digit, but not an ASCII one
        ("5-3", "ends before it starts"),
        ("1%0", "throttle"),
        ("1%", "throttle"),
        ("1%x", "throttle"),
    ],
)
def test_parse_array_expression_refuses(text: str, problem: str) -> None:
    error = _error(parse_array_expression, text)
    assert (error.field, error.value) == ("array", text)
    assert problem in str(error)


def test_parse_array_expression_names_the_callers_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_array_expression("x", field="job_id")
    assert caught.value.field == "job_id"


@given(st.frozensets(st.integers(min_value=0, max_value=5000), min_size=1, max_size=300),
       st.none() | st.integers(min_value=1, max_value=10_000))
def test_expression_round_trip(indices: frozenset[int], parallelism: int | None) -> None:
    text = array_expression(indices, parallelism)
    assert parse_array_expression(text) == (indices, parallelism)
    assert validate_array_expression("array", text) == text
    # Canonical: rendering what was parsed gives the same text back.
    assert array_expression(*parse_array_expression(text)) == text


def test_expression_round_trip_of_dense_and_sparse_sets() -> None:
    rng = random.Random(20261204)
    for _ in range(200):
        upper = rng.choice([3, 50, 1000, 100_000])
        indices = frozenset(rng.sample(range(upper), rng.randint(1, min(upper, 400))))
        parallelism = rng.choice([None, 1, rng.randint(2, 500)])
        assert parse_array_expression(array_expression(indices, parallelism)) == (
            indices, parallelism)


# --- validate_array_parallelism and validate_array_expression --------------------------


@pytest.mark.parametrize("value", [None, 1, 2, 10_000])
def test_valid_array_parallelism(value: int | None) -> None:
    assert validate_array_parallelism("array_parallelism", value) == value


@pytest.mark.parametrize("value", [0, -3, True, False, 1.0, "4", [2]])
def test_invalid_array_parallelism_names_field_and_value(value: object) -> None:
    error = _error(validate_array_parallelism, "array_parallelism", value)
    assert (error.field, error.value) == ("array_parallelism", value)
    assert str(error).startswith("array_parallelism=")
    assert "at least 1" in str(error)


@pytest.mark.parametrize("value", ["0", "0-99", "0-4,7%3", "1,3,5-9%1"])
def test_valid_array_expression(value: str) -> None:
    assert validate_array_expression("array", value) == value


@pytest.mark.parametrize("value", ["", " 0-3", "0-3 ", "0-4%0", "9-2", "0:4", "0-4%", 5, None])
def test_invalid_array_expression_names_field_and_value(value: object) -> None:
    error = _error(validate_array_expression, "array", value)
    assert (error.field, error.value) == ("array", value)


# --- SbatchSpec.array ------------------------------------------------------------------


def test_sbatch_spec_passes_the_array_sorted_with_the_other_options() -> None:
    spec = SbatchSpec(job_name="dg-arr", script_path="job.sh", partition="cpu",
                      array=array_expression(range(10), 2))
    argv = sbatch_argv(spec)
    assert "--array=0-9%2" in argv
    options = argv[1:-1]
    assert [o.split("=", 1)[0] for o in options] == sorted(o.split("=", 1)[0] for o in options)


def test_an_ordinary_job_passes_no_array() -> None:
    argv = sbatch_argv(SbatchSpec(job_name="dg", script_path="job.sh"))
    assert not [option for option in argv if option.startswith("--array")]


@pytest.mark.parametrize("value", ["", "0-", "5-3", "0-4%0", "0-15:4", "1 2", 3])
def test_sbatch_spec_refuses_a_bad_array(value: object) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SbatchSpec(job_name="dg", script_path="job.sh", array=value)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("array", value)


def test_sbatch_spec_refuses_a_heterogeneous_array() -> None:
    with pytest.raises(ConfigurationError) as caught:
        SbatchSpec(job_name="dg", script_path="job.sh", array="0-3",
                   het_components=(HetComponentSpec(num_nodes=1),))
    assert (caught.value.field, caught.value.value) == ("array", "0-3")
    assert "heterogeneous" in str(caught.value)


# --- MaxArraySize and the split of a run into arrays -----------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"MaxArraySize": "1001"}, 1001),
        ({"MaxArraySize": "4000001"}, 4_000_001),
        ({"MaxArraySize": " 50 "}, 50),
        ({"MaxArraySize": "0"}, 0),  # the site allows no arrays
        ({}, DEFAULT_MAX_ARRAY_SIZE),
        ({"MaxArraySize": ""}, DEFAULT_MAX_ARRAY_SIZE),
        ({"MaxArraySize": "(null)"}, DEFAULT_MAX_ARRAY_SIZE),
        ({"MaxArraySize": "-5"}, DEFAULT_MAX_ARRAY_SIZE),
        ({"MaxArraySize": "1e3"}, DEFAULT_MAX_ARRAY_SIZE),
    ],
)
def test_max_array_size(config: dict[str, str], expected: int) -> None:
    assert max_array_size(config) == expected


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_max_array_size_of_a_recorded_scontrol_show_config(release: str) -> None:
    text = (GOLDEN / release / "scontrol_show_config.stdout").read_text()
    assert max_array_size(parse_scontrol_config(text)) == 1001


@pytest.mark.parametrize(
    ("count", "limit", "expected"),
    [
        (0, 1001, []),
        (1, 1001, [(0, 1)]),
        (1001, 1001, [(0, 1001)]),
        (1002, 1001, [(0, 1001), (1001, 1)]),
        (2500, 1001, [(0, 1001), (1001, 1001), (2002, 498)]),
        (3, 1, [(0, 1), (1, 1), (2, 1)]),
    ],
)
def test_split_for_arrays(count: int, limit: int, expected: list[tuple[int, int]]) -> None:
    assert split_for_arrays(count, limit) == [ArrayChunk(o, s) for o, s in expected]


@given(st.integers(min_value=0, max_value=20_000), st.integers(min_value=1, max_value=5000))
def test_split_for_arrays_covers_every_key_once(count: int, limit: int) -> None:
    chunks = split_for_arrays(count, limit)
    positions = [chunk.offset + i for chunk in chunks for i in range(chunk.size)]
    assert positions == list(range(count))
    assert all(1 <= chunk.size <= limit for chunk in chunks)


def test_split_for_arrays_where_arrays_are_disabled() -> None:
    error = _error(split_for_arrays, 5, 0)
    assert (error.field, error.value) == ("MaxArraySize", 0)
    message = str(error)
    assert message.startswith("MaxArraySize=0: ")
    assert "allows no job arrays" in message
    assert "admins" in message
    assert "separate runs" in message


@pytest.mark.parametrize("count", [-1, True, 2.0])
def test_split_for_arrays_refuses_a_bad_count(count: object) -> None:
    error = _error(split_for_arrays, count, 1001)
    assert (error.field, error.value) == ("count", count)


# --- job ids of array tasks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        ("123_4", 4),
        ("123_0", 0),
        ("123_1000", 1000),
        ("124_4", None),
        ("1123_4", None),
        ("123_[5-9]", None),
        ("123", None),
        ("123_4.batch", None),
        ("123_4.0", None),
        ("123_", None),
        ("123_-1", None),
        ("123_\u0664", None),
        ("123+1", None),
    ],
)
def test_task_index_of(job_id: str, expected: int | None) -> None:
    assert task_index_of(job_id, "123") == expected


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        ("123_[5-9]", {5, 6, 7, 8, 9}),
        ("123_[5-999%10]", set(range(5, 1000))),
        ("123_[5,7-9]", {5, 7, 8, 9}),
        ("123_[x]", None),
        ("123_[5-9", None),
        ("1234_[5-9]", None),
        ("123_5", None),
    ],
)
def test_pending_range_of(job_id: str, expected: set[int] | None) -> None:
    found = pending_range_of(job_id, "123")
    assert found == (None if expected is None else frozenset(expected))


# --- squeue: the state of each task ----------------------------------------------------

_SQUEUE_LINE = "{id}|dg-arr|{state}|{reason}|0:50|1:00|{start}|N/A|{nodes}|1|N/A|cpu|1|500M|0:10|tok"


def _squeue(*rows: tuple[str, str, str]) -> str:
    """squeue output in SQUEUE_FORMAT (%i|%j|%T|%r|%L|%l|%S|%e|%N|%D|%b|%P|%C|%m|%M|%k)."""
    return "".join(
        _SQUEUE_LINE.format(id=job_id, state=state, reason=reason,
                            start="N/A" if state == "PENDING" else "2026-12-04T03:26:00",
                            nodes="" if state == "PENDING" else "c1") + "\n"
        for job_id, state, reason in rows)


# composed: an array of 1000 tasks throttled to 10, tasks 0-4 started (one still
# completing, one failed), the rest folded into one pending line; plus other jobs.
SQUEUE_ARRAY = _squeue(
    ("123_[5-999%10]", "PENDING", "JobArrayTaskLimit"),
    ("123_0", "COMPLETED", "None"),
    ("123_1", "RUNNING", "None"),
    ("123_2", "COMPLETING", "None"),
    ("123_3", "FAILED", "NonZeroExitCode"),
    ("123_4", "RUNNING", "None"),
    ("124_1", "RUNNING", "None"),
    ("1234_[0-3]", "PENDING", "Priority"),
    ("12", "RUNNING", "None"),
)


def test_fold_array_queue() -> None:
    records = parse_squeue(SQUEUE_ARRAY)
    assert len(records) == 9
    view = fold_array_queue(records, "123")
    assert view.listed
    assert view.pending_reason == "JobArrayTaskLimit"
    assert view.running == {1, 2, 4}
    assert view.ended == {0, 3}
    assert view.pending == set(range(5, 1000))
    assert view.states[3] is JobState.FAILED
    assert view.states[2] is JobState.COMPLETING
    assert set(view.states) == set(range(1000))


def test_fold_array_queue_does_not_depend_on_line_order() -> None:
    records = parse_squeue(SQUEUE_ARRAY)
    assert fold_array_queue(reversed(records), "123") == fold_array_queue(records, "123")


def test_a_tasks_own_line_wins_over_the_pending_range() -> None:
    text = _squeue(("123_5", "RUNNING", "None"), ("123_[5,7-9]", "PENDING", "Resources"))
    view = fold_array_queue(parse_squeue(text), "123")
    assert view.running == {5}
    assert view.pending == {7, 8, 9}
    assert view.pending_reason == "Resources"


def test_an_array_of_other_jobs_only_is_not_listed() -> None:
    view = fold_array_queue(parse_squeue(SQUEUE_ARRAY), "125")
    assert not view.listed
    assert view.states == {}
    assert view.pending_reason is None
    assert view.running == view.pending == view.ended == frozenset()


def test_all_tasks_started() -> None:
    text = _squeue(("123_0", "RUNNING", "None"), ("123_1", "COMPLETED", "None"))
    view = fold_array_queue(parse_squeue(text), "123")
    assert view.listed
    assert view.pending == frozenset()
    assert view.pending_reason is None


def test_a_task_waiting_on_a_line_of_its_own_gives_the_reason() -> None:
    # An array of one task, or a requeued task, waits as <array>_<index>.
    text = _squeue(("123_0", "PENDING", "Priority"))
    view = fold_array_queue(parse_squeue(text), "123")
    assert view.pending == {0}
    assert view.pending_reason == "Priority"


def test_requeued_and_unreadable_states() -> None:
    text = _squeue(("123_0", "REQUEUED", "None"), ("123_1", "SUSPENDED", "None"),
                   ("123_2", "WHATEVER", "None"))
    view = fold_array_queue(parse_squeue(text), "123")
    assert view.pending == {0}
    assert view.running == {1}
    assert view.states[2] is JobState.UNKNOWN
    assert 2 not in view.pending | view.running | view.ended


def test_an_unreadable_pending_range_marks_the_array_listed() -> None:
    text = _squeue(("123_[5-?]", "PENDING", "Resources"))
    view = fold_array_queue(parse_squeue(text), "123")
    assert view.listed
    assert view.states == {}
    assert view.pending_reason == "Resources"


# --- sacct: the accounting record of each task -----------------------------------------

_REQ = "billing=1,cpu=1,mem=500M,node=1"
_USE = "cpu=00:00:01,energy=0,fs/disk=2012,mem={rss},pages=0,vmem=9000K"
_WHERE = "cpu=c1,energy=c1,fs/disk=c1,mem=c1,pages=c1,vmem=c1"

# composed: sacct --parsable2 --noheader of array 123 (tasks 0-4, two at a time) after
# task 0 completed, task 1 failed and task 2 started; tasks 3 and 4 still wait, printed as
# one 123_[3-4%2] line. Another job's lines in between.
SACCT_ARRAY = "\n".join([
    f"123_0|dg-arr|COMPLETED|0:0|00:00:05|5||00:00.900|1|c1|1|2026-12-04T03:26:00|2026-12-04T03:26:05|{_REQ}|{_REQ}|||",
    f"123_0.batch|batch|COMPLETED|0:0|00:00:05|5|2048K|00:00.900|1|c1|1|2026-12-04T03:26:00|2026-12-04T03:26:05||cpu=1,mem=500M,node=1|{_USE.format(rss='2048K')}|{_USE.format(rss='2048K')}|{_WHERE}",
    f"123_0.extern|extern|COMPLETED|0:0|00:00:05|5|0|00:00:00|1|c1|1|2026-12-04T03:26:00|2026-12-04T03:26:05||billing=1,cpu=1,mem=500M,node=1|{_USE.format(rss='0')}|{_USE.format(rss='0')}|{_WHERE}",
    f"123_1|dg-arr|FAILED|3:0|00:00:02|2||00:00.300|1|c2|1|2026-12-04T03:26:00|2026-12-04T03:26:02|{_REQ}|{_REQ}|||",
    f"123_1.batch|batch|FAILED|3:0|00:00:02|2|1024K|00:00.300|1|c2|1|2026-12-04T03:26:00|2026-12-04T03:26:02||cpu=1,mem=500M,node=1|{_USE.format(rss='1024K')}|{_USE.format(rss='1024K')}|{_WHERE}",
    f"99|other|COMPLETED|0:0|00:00:01|1||00:00:00|1|c1|1|2026-12-04T03:25:00|2026-12-04T03:25:01|{_REQ}|{_REQ}|||",
    f"123_2|dg-arr|RUNNING|0:0|00:00:01|1||00:00:00|1|c1|1|2026-12-04T03:26:05|Unknown|{_REQ}|{_REQ}|||",
    "123_2.batch|batch|RUNNING|0:0|00:00:01|1||00:00:00|1|c1|1|2026-12-04T03:26:05|Unknown||cpu=1,mem=500M,node=1|||",
    f"123_[3-4%2]|dg-arr|PENDING|0:0|00:00:00|0||00:00:00|1|None assigned|1|Unknown|Unknown|{_REQ}||||",
]) + "\n"


def test_the_sacct_sample_follows_the_requested_columns() -> None:
    assert SACCT_FIELDS == (
        "JobID", "JobName", "State", "ExitCode", "Elapsed", "ElapsedRaw", "MaxRSS", "TotalCPU",
        "NNodes", "NodeList", "AllocCPUS", "Start", "End", "ReqTRES", "AllocTRES",
        "TRESUsageInAve", "TRESUsageInMax", "TRESUsageInMaxNode",
    )
    assert {line.count("|") for line in SACCT_ARRAY.splitlines()} == {len(SACCT_FIELDS) - 1}


def test_fold_array_accounting() -> None:
    records = parse_sacct(SACCT_ARRAY)
    assert "123_[3-4%2]" in records  # parsed, but no task of its own
    tasks = fold_array_accounting(records, "123")
    assert sorted(tasks) == [0, 1, 2]
    assert tasks[0].state is JobState.COMPLETED
    assert tasks[0].job_id == "123_0"
    assert tasks[0].max_rss_bytes == 2048 * 1024
    assert [step.step_id for step in tasks[0].steps] == ["batch", "extern"]
    assert tasks[0].elapsed_seconds == 5
    assert (tasks[1].state, tasks[1].exit_code) == (JobState.FAILED, 3)
    assert tasks[2].state is JobState.RUNNING
    assert tasks[2].end_time is None


def test_fold_array_accounting_leaves_other_jobs_out() -> None:
    records = parse_sacct(SACCT_ARRAY)
    assert fold_array_accounting(records, "99") == {}
    assert fold_array_accounting(records, "12") == {}
    assert fold_array_accounting({}, "123") == {}
