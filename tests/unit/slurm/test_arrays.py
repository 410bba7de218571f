"""Job arrays: the --array value, MaxArraySize, and squeue/sacct folded per task."""

import random

import pytest

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
    split_for_arrays,
    task_index_of,
    validate_array_parallelism,
)
from dagster_slurm.slurm.commands import SACCT_FIELDS, SbatchSpec, sbatch_argv
from dagster_slurm.slurm.parsers import parse_squeue
from dagster_slurm.slurm.states import JobState


@pytest.mark.parametrize(("indices", "parallelism", "expected"), [
    ([0, 1, 2, 3, 4], None, "0-4"),
    ([7, 0, 1, 1, 2, 9, 10, 11, 12], 3, "0-2,7,9-12%3"),
    ([5], 1, "5%1"),
])
def test_array_expression_compresses_runs(indices, parallelism, expected):
    assert array_expression(indices, parallelism) == expected


def test_array_expression_round_trips():
    chooser = random.Random(29)
    for _ in range(300):
        indices = set(chooser.sample(range(60), chooser.randint(1, 40)))
        parallelism = chooser.choice([None, 1, 4, 100])
        assert parse_array_expression(array_expression(indices, parallelism)) == \
            (frozenset(indices), parallelism)


@pytest.mark.parametrize(("indices", "parallelism", "field"), [
    ([], None, "indices"), ([-1, 2], None, "indices"), ([1], 0, "array_parallelism"),
    ([1], True, "array_parallelism"),
])
def test_bad_arrays_name_the_field(indices, parallelism, field):
    with pytest.raises(ConfigurationError) as caught:
        array_expression(indices, parallelism)
    assert caught.value.field == field


def test_the_parallelism_must_be_a_whole_number_of_at_least_one():
    assert validate_array_parallelism("array_parallelism", None) is None
    assert validate_array_parallelism("array_parallelism", 4) == 4
    for bad in (0, -2, 1.5, "3", False):
        with pytest.raises(ConfigurationError, match="array_parallelism"):
            validate_array_parallelism("array_parallelism", bad)


def test_an_array_spec_passes_array_and_a_bad_one_is_refused():
    argv = sbatch_argv(SbatchSpec("j", "/s", array="0-199%3"))
    assert "--array=0-199%3" in argv and argv[-1] == "/s"
    assert not any(a.startswith("--array") for a in sbatch_argv(SbatchSpec("j", "/s")))
    for bad in ("", "1-", "5-2", "1,,2", "0-9%0", "0-9;rm", "$(x)"):
        with pytest.raises(ConfigurationError) as caught:
            SbatchSpec("j", "/s", array=bad)
        assert caught.value.field == "array"


def test_max_array_size_bounds_the_index_and_splits_runs():
    assert max_array_size({"MaxArraySize": "1001"}) == 1001
    assert max_array_size({}) == DEFAULT_MAX_ARRAY_SIZE
    assert max_array_size({"MaxArraySize": "n/a"}) == DEFAULT_MAX_ARRAY_SIZE
    assert max_array_size({"MaxArraySize": "0"}) == 0
    assert split_for_arrays(2500, 1001) == [ArrayChunk(0, 1001), ArrayChunk(1001, 1001),
                                            ArrayChunk(2002, 498)]
    assert split_for_arrays(7, 1001) == [ArrayChunk(0, 7)]
    with pytest.raises(ConfigurationError, match="allows no job arrays"):
        split_for_arrays(7, 0)


def test_task_index_of_names_only_tasks_of_that_array():
    assert task_index_of("123_4", "123") == 4
    for other in ("1234_4", "123", "123_[5-9]", "123_4.batch", "12_4"):
        assert task_index_of(other, "123") is None


SQUEUE = "\n".join([
    "123_[6-9%2]|dsl-x|PENDING|JobArrayTaskLimit|10:00|10:00|N/A|N/A||1|N/A|cpu|1|500M|0:00|t",
    "123_4|dsl-x|RUNNING|None|9:00|10:00|2026-12-04T12:00:00|N/A|c1|1|N/A|cpu|1|500M|1:00|t",
    "123_5|dsl-x|COMPLETING|None|9:00|10:00|2026-12-04T12:00:00|N/A|c2|1|N/A|cpu|1|500M|1:00|t",
    "123_0|dsl-x|COMPLETED|None|0:00|10:00|2026-12-04T12:00:00|N/A|c1|1|N/A|cpu|1|500M|0:01|t",
    "123_1|dsl-x|FAILED|NonZeroExitCode|0:00|10:00|2026-12-04T12:00:00|N/A|c1|1|N/A|cpu|1|500M|0:01|t",
    "999|other|RUNNING|None|9:00|10:00|2026-12-04T12:00:00|N/A|c1|1|N/A|cpu|1|500M|1:00|t",
])


def test_squeue_is_folded_into_a_state_per_task():
    view = fold_array_queue(parse_squeue(SQUEUE), "123")
    assert view.listed
    assert view.pending == {6, 7, 8, 9}
    assert view.running == {4, 5}
    assert view.ended == {0, 1}
    assert view.states[1] is JobState.FAILED
    assert view.pending_reason == "JobArrayTaskLimit"
    assert 2 not in view.states  # purged after MinJobAge: neither pending nor listed
    assert not fold_array_queue(parse_squeue(SQUEUE), "77").listed


def test_sacct_is_folded_per_task():
    def row(job_id: str, state: str, exit_code: str = "0:0") -> str:
        values = {"JobID": job_id, "JobName": "dsl-x" if "." not in job_id else "batch",
                  "State": state, "ExitCode": exit_code, "Elapsed": "00:00:02",
                  "ElapsedRaw": "2", "MaxRSS": "" if "." not in job_id else "20M",
                  "TotalCPU": "00:01.000", "NNodes": "1", "NodeList": "c1", "AllocCPUS": "1",
                  "Start": "2026-12-04T12:00:00", "End": "2026-12-04T12:00:02"}
        return "|".join(values.get(field, "") for field in SACCT_FIELDS)

    text = "\n".join([row("123_0", "COMPLETED"), row("123_0.batch", "COMPLETED"),
                      row("123_1", "FAILED", "3:0"), row("123_1.batch", "FAILED", "3:0"),
                      row("123_[2-9%2]", "PENDING"), row("999", "COMPLETED")])
    tasks = fold_array_accounting(parse_sacct(text), "123")
    assert sorted(tasks) == [0, 1]
    assert tasks[0].state is JobState.COMPLETED and tasks[0].max_rss_bytes == 20 * 2**20
    assert tasks[1].state is JobState.FAILED and tasks[1].exit_code == 3
