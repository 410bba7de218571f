from __future__ import annotations

import math
from datetime import datetime

import pytest
import slurm_outputs as out

from dagster_slurm.slurm.hostlist import MAX_HOSTS, expand_hostlist
from dagster_slurm.slurm.parsers import (
    SqueueRecord,
    min_job_age_seconds,
    parse_sbatch_parsable,
    parse_scontrol_config,
    parse_squeue,
    parse_test_only,
)
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.walltime import parse_duration


@pytest.mark.parametrize(
    ("text", "job_id"),
    [
        ("123\n", "123"),
        ("123;lab2\n", "123"),
        ("  42  ", "42"),
        ("sbatch: warning: something odd\n77\n", "77"),
        ("", None),
        ("Submitted batch job 12\n", None),  # not --parsable output
        ("12a", None),
        ("-1", None),
    ],
)
def test_parse_sbatch_parsable(text: str, job_id: str | None) -> None:
    assert parse_sbatch_parsable(text) == job_id


def _by_id(records: list[SqueueRecord]) -> dict[str, SqueueRecord]:
    return {record.job_id: record for record in records}


@pytest.mark.parametrize("text", [out.SQUEUE_DEFAULT_LAYOUT, out.SQUEUE_WITH_HEADER])
def test_squeue_measured_rows(text: str) -> None:
    records = _by_id(parse_squeue(text))
    assert set(records) == {"14", "10"}

    waiter = records["14"]
    assert waiter.name == "waiter"
    assert waiter.state is JobState.PENDING
    assert waiter.reason == "Resources"
    assert waiter.time_left_seconds == 60  # %L of a pending job is its limit
    assert waiter.time_limit_seconds == 60
    assert waiter.start_time is None and waiter.end_time is None
    assert waiter.node_list is None
    assert waiter.nodes == ()
    assert waiter.num_nodes == 1
    assert waiter.tres_per_node is None
    assert waiter.partition == "cpu"
    assert waiter.cpus == 1
    assert waiter.min_memory_bytes == 1000 * 1024**2
    assert waiter.elapsed_seconds == 0
    assert waiter.comment == "tok-xyz"

    busy = records["10"]
    assert busy.state is JobState.RUNNING
    assert busy.reason is None  # Slurm prints "None"
    assert busy.time_left_seconds == 178
    assert busy.time_limit_seconds == 180
    assert busy.start_time == datetime(2026, 11, 30, 5, 32, 53)
    assert busy.end_time == datetime(2026, 11, 30, 5, 35, 53)
    assert busy.node_list == "c[1-2]"
    assert busy.nodes == ("c1", "c2")
    assert busy.num_nodes == 2
    assert busy.cpus == 4
    assert busy.elapsed_seconds == 2
    assert busy.comment == "tok-abc123"


def test_squeue_edge_rows() -> None:
    records = _by_id(parse_squeue(out.SQUEUE_EDGE_ROWS))
    gpu = records["21"]
    assert gpu.tres_per_node == "gres:gpu:2"
    assert gpu.comment == "tok|with|pipes"  # the comment is last, so '|' stays in it
    assert gpu.nodes == ("g1",)

    over = records["22"]
    assert over.time_left_seconds is None  # INVALID
    assert over.time_limit_seconds == 60
    assert over.elapsed_seconds == 87
    assert over.comment is None  # (null)

    unlimited = records["23"]
    assert unlimited.time_left_seconds == math.inf
    assert unlimited.time_limit_seconds == math.inf
    assert unlimited.end_time is None
    assert unlimited.comment is None


def test_squeue_time_columns_after_scontrol_update() -> None:
    rows = [line.split("|") for line in out.SQUEUE_TIME_UPDATES]
    assert [[parse_duration(cell) for cell in row] for row in rows] == [
        [598, 600, 2],
        [298, 300, 2],
        [478, 480],
        [418, 420],
    ]


def test_squeue_unreadable_fields_are_none() -> None:
    line = "99|x|WEIRD|None|soon|later|yesterday|N/A|c[2-1]|two|N/A|cpu|many|lots|?|"
    (record,) = parse_squeue(line)
    assert record.state is JobState.UNKNOWN
    assert record.raw_state == "WEIRD"
    assert record.time_left_seconds is None
    assert record.time_limit_seconds is None
    assert record.start_time is None
    assert record.node_list == "c[2-1]"
    assert record.nodes is None  # descending range: unreadable, not "no nodes"
    assert record.num_nodes is None
    assert record.cpus is None
    assert record.min_memory_bytes is None
    assert record.elapsed_seconds is None
    assert record.comment is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        out.SQUEUE_PURGED,
        "10|busy|RUNNING",  # too few columns
        "|x|RUNNING|None|1:00|1:00|N/A|N/A||1|N/A|cpu|1|1M|0:00|c",  # no job id
        "JOBID|NAME\n",
    ],
)
def test_squeue_skips_unusable_lines(text: str) -> None:
    assert parse_squeue(text) == []


def test_squeue_non_string() -> None:
    assert parse_squeue(None) == []


@pytest.mark.parametrize(("line", "expected"), out.TEST_ONLY_RUNNABLE)
def test_test_only_runnable(line: str, expected: tuple[object, ...]) -> None:
    job_id, start, processors, nodes, partition = expected
    result = parse_test_only(line + "\n", 0)
    assert result.runnable is True
    assert result.job_id == job_id
    assert result.start_time == datetime.fromisoformat(str(start))
    assert result.processors == processors
    assert result.nodes == nodes
    assert result.partition == partition
    assert result.error is None


def test_test_only_no_resources() -> None:
    result = parse_test_only(out.TEST_ONLY_NO_RESOURCES, 1)
    assert result.runnable is False
    assert result.error == "Requested node configuration is not available"
    assert result.job_id is None
    assert result.start_time is None
    assert result.processors is None
    assert result.nodes is None
    assert result.partition is None


def test_test_only_bad_partition_prefers_the_allocation_failure() -> None:
    result = parse_test_only(out.TEST_ONLY_BAD_PARTITION, 1)
    assert result.runnable is False
    assert result.error == "Invalid partition name specified"


@pytest.mark.parametrize(
    ("stderr", "exit_code", "runnable", "error"),
    [
        ("", None, None, None),
        ("", 0, None, None),
        ("", 1, False, None),
        ("something broke\n", 1, False, "something broke"),
        ("sbatch: error: Batch job submission failed: Invalid account\n", 1, False, "Invalid account"),
        ("sbatch: error: invalid partition specified: nosuch\n", None, False,
         "invalid partition specified: nosuch"),
        (out.TEST_ONLY_RUNNABLE[0][0], None, True, None),
        (out.TEST_ONLY_RUNNABLE[0][0], 1, False, out.TEST_ONLY_RUNNABLE[0][0]),
    ],
)  # fmt: skip
def test_test_only_decisions(
    stderr: str, exit_code: int | None, runnable: bool | None, error: str | None
) -> None:
    result = parse_test_only(stderr, exit_code)
    assert result.runnable is runnable
    assert result.error == error


def test_scontrol_config() -> None:
    config = parse_scontrol_config(out.SCONTROL_CONFIG)
    assert config["MinJobAge"] == "60 sec"
    assert config["ClusterName"] == "lab2"
    assert config["SchedulerParameters"] == "bf_interval=30,bf_window=1440"
    assert config["SlurmctldHost[0]"] == "localhost(10.77.0.1)"
    assert config["AllowedRAMSpace"] == "100.0%"
    assert not any(key.startswith(("Configuration", "Slurmctld(", "Cgroup")) for key in config)
    assert min_job_age_seconds(config) == 60


@pytest.mark.parametrize(
    ("config", "seconds"),
    [
        ({"MinJobAge": "300 sec"}, 300),
        ({"MinJobAge": "300"}, 300),
        ({"minjobage": "5 sec"}, 5),
        ({"MinJobAge": "forever"}, None),
        ({"MinJobAge": ""}, None),
        ({}, None),
    ],
)
def test_min_job_age(config: dict[str, str], seconds: int | None) -> None:
    assert min_job_age_seconds(config) == seconds


def test_scontrol_config_of_nothing() -> None:
    assert parse_scontrol_config("") == {}
    assert parse_scontrol_config(None) == {}
    assert min_job_age_seconds(parse_scontrol_config("error: cannot connect\n")) is None


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("c[1-2],g[01-03,7],x", ("c1", "c2", "g01", "g02", "g03", "g7", "x")),
        ("c[1-2]", ("c1", "c2")),
        ("g1", ("g1",)),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("n[08-10]", ("n08", "n09", "n10")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("a,b.example.org", ("a", "b.example.org")),
        ("[1-2]x", ("1x", "2x")),
        ("", ()),
        ("None assigned", ()),
        ("(null)", ()),
        ("N/A", ()),
    ],
)
def test_expand_hostlist(text: str, hosts: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text",
    ["c[1-2", "c1-2]", "c[[1]]", "c[2-1]", "c[a-b]", "c[]", "c[1-]", "a,,b", "a b", ",", "c[1,]"],
)
def test_unreadable_hostlists_are_none(text: str) -> None:
    assert expand_hostlist(text) is None


def test_hostlist_size_is_bounded() -> None:
    assert expand_hostlist(f"n[1-{MAX_HOSTS}]") is not None
    assert expand_hostlist(f"n[1-{MAX_HOSTS + 1}]") is None
    assert expand_hostlist("a[1-1000]b[1-1000]") is None
    assert expand_hostlist(None) is None
