"""SlurmRunAllocationConfig: inheritance from the queue, validation, and shape checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import ValidationError

from dagster_slurm.compute.options import sbatch_overrides
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.session.core.config import (
    SlurmRunAllocationConfig,
    check_shape,
    shape_mismatches,
)
from dagster_slurm.slurm.queue import SlurmQueueConfig


def _queue(**overrides: Any) -> SlurmQueueConfig:
    values: dict[str, Any] = {
        "partition": "cpu",
        "num_nodes": 2,
        "cpus": 4,
        "gpus_per_node": 1,
        "mem": "8G",
        "time_limit": "02:00:00",
        "time_min": "01:00:00",
        "qos": "normal",
        "account": "proj",
        "reservation": "res1",
        "signal_before_timeout": "USR1@120",
        "extra_sbatch_directives": ["--constraint=a100"],
    }
    values.update(overrides)
    return SlurmQueueConfig(**values)


# -- inheritance -------------------------------------------------------------------------------


def test_unset_fields_inherit_the_queue_except_extra_directives() -> None:
    queue = _queue()
    combined = SlurmRunAllocationConfig().queue_for(queue)
    expected = queue.model_dump()
    expected["extra_sbatch_directives"] = []  # never inherited
    assert combined.model_dump() == expected


def test_queue_directives_do_not_leak_into_the_allocation_request() -> None:
    spec = SlurmRunAllocationConfig().queue_for(_queue()).to_sbatch_spec("j", "s")
    assert spec.extra_directives == ()
    own = SlurmRunAllocationConfig(extra_sbatch_directives=["--constraint=v100"])
    assert own.queue_for(_queue()).extra_sbatch_directives == ["--constraint=v100"]
    assert own.queue_for(_queue()).to_sbatch_spec("j", "s").extra_directives == (
        "--constraint=v100",
    )


@pytest.mark.parametrize(
    ("field", "value", "queue_field", "expected"),
    [
        ("partition", "gpu", "partition", "gpu"),
        ("num_nodes", 4, "num_nodes", 4),
        ("cpus_per_task", 16, "cpus", 16),
        ("gpus_per_node", 2, "gpus_per_node", 2),
        ("mem", "32G", "mem", "32G"),
        ("time_limit", "180", "time_limit", "03:00:00"),
        ("time_min", "90", "time_min", "01:30:00"),
        ("qos", "high", "qos", "high"),
        ("account", "other", "account", "other"),
        ("reservation", "res2", "reservation", "res2"),
        ("signal_before_timeout", "TERM@300", "signal_before_timeout", "TERM@300"),
    ],
)
def test_set_fields_replace_the_queue_values(
    field: str, value: Any, queue_field: str, expected: Any
) -> None:
    queue = _queue()
    combined = SlurmRunAllocationConfig(**{field: value}).queue_for(queue)
    assert getattr(combined, queue_field) == expected
    # every other field is still the queue's
    untouched = {k: v for k, v in queue.model_dump().items()
                 if k not in (queue_field, "extra_sbatch_directives")}
    assert {k: combined.model_dump()[k] for k in untouched} == untouched


def test_cpus_per_task_reaches_the_sbatch_request() -> None:
    spec = SlurmRunAllocationConfig(cpus_per_task=12).queue_for(_queue()).to_sbatch_spec("j", "s")
    assert spec.cpus_per_task == 12
    spec = SlurmRunAllocationConfig().queue_for(_queue(cpus=3)).to_sbatch_spec("j", "s")
    assert spec.cpus_per_task == 3


def test_mem_per_cpu_replaces_the_queue_mem() -> None:
    combined = SlurmRunAllocationConfig(mem_per_cpu="1G").queue_for(_queue(mem="8G"))
    assert (combined.mem, combined.mem_per_cpu) == (None, "1G")
    spec = combined.to_sbatch_spec("j", "s")
    assert (spec.mem, spec.mem_per_cpu) == (None, "1G")


def test_mem_replaces_the_queue_mem_per_cpu() -> None:
    combined = SlurmRunAllocationConfig(mem="16G").queue_for(_queue(mem_per_cpu="1G"))
    assert (combined.mem, combined.mem_per_cpu) == ("16G", None)
    spec = combined.to_sbatch_spec("j", "s")
    assert (spec.mem, spec.mem_per_cpu) == ("16G", None)


def test_queue_mem_per_cpu_is_inherited_when_nothing_is_set() -> None:
    spec = SlurmRunAllocationConfig().queue_for(_queue(mem_per_cpu="2G")).to_sbatch_spec("j", "s")
    assert (spec.mem, spec.mem_per_cpu) == (None, "2G")


def test_snapshot_is_json_able_and_complete() -> None:
    import json

    config = SlurmRunAllocationConfig(partition="gpu", heartbeat_timeout=None)
    snap = config.snapshot()
    assert json.loads(json.dumps(snap)) == snap
    assert snap["partition"] == "gpu" and snap["heartbeat_timeout"] is None
    assert SlurmRunAllocationConfig(**snap) == config


# -- validation ----------------------------------------------------------------------------------


def _validation_message(**kwargs: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        SlurmRunAllocationConfig(**kwargs)
    return str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"heartbeat_timeout": 4.9}, "heartbeat_timeout=4.9"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout=0"),
        ({"heartbeat_timeout": -10}, "heartbeat_timeout=-10"),
        ({"heartbeat_interval": 0}, "heartbeat_interval=0"),
        ({"heartbeat_interval": -1}, "heartbeat_interval=-1"),
        ({"startup_timeout": -1}, "startup_timeout=-1"),
        ({"startup_timeout": 0}, "startup_timeout=0"),
    ],
)
def test_bad_timing_values_name_the_field(kwargs: dict[str, Any], expected: str) -> None:
    message = _validation_message(**kwargs)
    assert expected in message
    assert next(iter(kwargs)) in message


def test_heartbeat_timeout_of_five_seconds_or_none_is_accepted() -> None:
    config = SlurmRunAllocationConfig(
        heartbeat_timeout=5, heartbeat_interval=2, allow_short_heartbeat_timeout=True
    )
    assert config.heartbeat_timeout == 5
    config = SlurmRunAllocationConfig(heartbeat_timeout=None, heartbeat_interval=1000)
    assert config.queue_for(_queue()).partition == "cpu"  # no heartbeat check without timeout


@pytest.mark.parametrize("timeout", [20.0, 10.0, 5.0])
def test_heartbeat_timeout_must_exceed_twice_the_interval(timeout: float) -> None:
    # checked when the configuration is built, before any session exists
    with pytest.raises(ValueError, match="heartbeat_timeout") as caught:
        SlurmRunAllocationConfig(heartbeat_timeout=timeout, heartbeat_interval=10,
                                 allow_short_heartbeat_timeout=True)
    assert "heartbeat_interval" in str(caught.value) and repr(timeout) in str(caught.value)


def test_heartbeat_timeout_just_above_twice_the_interval_is_accepted() -> None:
    SlurmRunAllocationConfig(
        heartbeat_timeout=20.5, heartbeat_interval=10, allow_short_heartbeat_timeout=True
    ).queue_for(_queue())


@pytest.mark.parametrize("timeout", [5.0, 60.0, 119.9])
def test_heartbeat_timeout_too_short_for_a_shared_filesystem_is_refused(timeout: float) -> None:
    message = _validation_message(heartbeat_timeout=timeout, heartbeat_interval=1)
    assert f"heartbeat_timeout={timeout!r}" in message
    assert "at least 120 seconds" in message and "allow_short_heartbeat_timeout" in message


def test_heartbeat_timeout_of_the_shared_filesystem_minimum_is_accepted() -> None:
    assert SlurmRunAllocationConfig(heartbeat_timeout=120).heartbeat_timeout == 120


def test_short_heartbeat_timeout_still_has_a_floor_with_the_escape_hatch() -> None:
    message = _validation_message(heartbeat_timeout=4, heartbeat_interval=1,
                                  allow_short_heartbeat_timeout=True)
    assert "heartbeat_timeout=4" in message and "at least 5 seconds" in message


def test_time_min_above_time_limit_names_time_min() -> None:
    # both values are the allocation's own: refused when it is built
    with pytest.raises((ConfigurationError, ValidationError)) as caught:
        SlurmRunAllocationConfig(time_limit="60", time_min="90")
    assert "time_min='01:30:00'" in str(caught.value)
    assert "time_limit='01:00:00'" in str(caught.value)


def test_inherited_time_min_is_checked_against_a_shorter_time_limit() -> None:
    # the queue's time_min (01:00:00) no longer fits the allocation's 30 minutes
    with pytest.raises((ConfigurationError, ValidationError)) as caught:
        SlurmRunAllocationConfig(time_limit="30").queue_for(_queue())
    assert "time_min" in str(caught.value)


def test_signal_lead_longer_than_the_walltime_names_the_signal() -> None:
    # both values are the allocation's own: refused when it is built
    with pytest.raises((ConfigurationError, ValidationError)) as caught:
        SlurmRunAllocationConfig(signal_before_timeout="USR1@600", time_limit="5", time_min=None)
    assert "signal_before_timeout='USR1@600'" in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"partition": "gpu; touch pwned"}, "partition='gpu; touch pwned'"),
        ({"mem": "4 GB"}, "mem='4 GB'"),
        ({"num_nodes": 0}, "num_nodes=0"),
        ({"extra_sbatch_directives": ["--wrap=id"]}, "--wrap=id"),
        ({"extra_sbatch_directives": ["--time=5"]}, "time_limit"),
    ],
)
def test_bad_shape_values_fail_when_combined_naming_the_value(
    kwargs: dict[str, Any], expected: str
) -> None:
    with pytest.raises((ConfigurationError, ValidationError)) as caught:
        SlurmRunAllocationConfig(**kwargs).queue_for(_queue())
    assert expected in str(caught.value)


# -- shape checks ----------------------------------------------------------------------------------


def _allocation(**config: Any):
    return SlurmRunAllocationConfig(**config).queue_for(_queue()).to_sbatch_spec("j", "s")


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"time": "120"},
        {"time_limit": "02:00:00"},
        {"time": "2:00:00"},
        {"time_min": "60"},
        {"partition": "cpu"},
        {"nodes": 2},
        {"num_nodes": 2, "cpus": 4},
        {"cpus_per_task": 4},
        {"mem": "8G"},
        {"gpus_per_node": 1},
        {"qos": "normal", "account": "proj", "reservation": "res1"},
    ],
)
def test_the_same_values_in_other_spellings_are_not_mismatches(opts: dict[str, Any]) -> None:
    spec = _allocation()
    assert shape_mismatches(spec, sbatch_overrides(opts)) == []
    checked = check_shape(SlurmRunAllocationConfig(), _queue(), sbatch_overrides(opts), opts)
    assert dataclasses.replace(checked, job_name="j", script_path="s") == spec


def test_time_in_minutes_matches_the_allocation_time_in_hours() -> None:
    spec = _allocation(time_limit="01:00:00")
    assert shape_mismatches(spec, sbatch_overrides({"time": "60"})) == []
    spec = _allocation(time_limit="60")
    assert shape_mismatches(spec, sbatch_overrides({"time_limit": "01:00:00"})) == []


def test_zero_gpus_matches_an_allocation_without_gpus() -> None:
    spec = _allocation(gpus_per_node=0)
    assert spec.gpus_per_node is None
    assert shape_mismatches(spec, sbatch_overrides({"gpus_per_node": 0})) == []


@pytest.mark.parametrize(
    ("opts", "field", "asked", "has"),
    [
        ({"partition": "gpu"}, "partition", "'gpu'", "'cpu'"),
        ({"nodes": 3}, "num_nodes", "3", "2"),
        ({"num_nodes": 1}, "num_nodes", "1", "2"),
        ({"mem": "16G"}, "mem", "'16G'", "'8G'"),
        ({"gpus_per_node": 2}, "gpus_per_node", "2", "1"),
        ({"gpus_per_node": 0}, "gpus_per_node", "None", "1"),
        ({"cpus": 8}, "cpus_per_task", "8", "4"),
        ({"time": "121"}, "time_limit", "'02:01:00'", "'02:00:00'"),
        ({"qos": "high"}, "qos", "'high'", "'normal'"),
        ({"mem_per_cpu": "1G"}, "mem_per_cpu", "'1G'", "None"),
        ({"exclusive": True}, "exclusive", "True", "False"),
        ({"extra_sbatch_directives": ["--constraint=v100"]}, "extra_directives",
         "('--constraint=v100',)", "()"),
    ],
)
def test_a_different_shape_is_refused_naming_field_and_both_values(
    opts: dict[str, Any], field: str, asked: str, has: str
) -> None:
    overrides = sbatch_overrides(opts)
    problems = shape_mismatches(_allocation(), overrides)
    assert len(problems) == 1
    assert problems[0].startswith(f"{field}:")
    assert asked in problems[0] and has in problems[0]
    with pytest.raises(ConfigurationError) as caught:
        check_shape(SlurmRunAllocationConfig(), _queue(), overrides, opts)
    error = caught.value
    assert error.field == "extra_slurm_opts"
    assert error.value == opts
    message = str(error)
    assert message.startswith("extra_slurm_opts=")
    assert field in message and asked in message and has in message
    assert "SlurmRunAllocationConfig" in message and "allocation_scope='asset'" in message


def test_every_differing_field_is_named() -> None:
    opts = {"partition": "gpu", "nodes": 1, "mem": "8G", "gpus_per_node": 4}
    with pytest.raises(ConfigurationError) as caught:
        check_shape(SlurmRunAllocationConfig(), _queue(), sbatch_overrides(opts), opts)
    message = str(caught.value)
    assert "partition: the step asks for 'gpu', the run allocation has 'cpu'" in message
    assert "num_nodes: the step asks for 1, the run allocation has 2" in message
    assert "gpus_per_node: the step asks for 4, the run allocation has 1" in message
    assert "mem:" not in message  # the same value is not a mismatch


def test_the_allocation_config_not_the_queue_is_the_reference() -> None:
    config = SlurmRunAllocationConfig(partition="gpu", num_nodes=4)
    opts = {"partition": "gpu", "nodes": 4}
    check_shape(config, _queue(), sbatch_overrides(opts), opts)
    opts = {"partition": "cpu"}
    with pytest.raises(ConfigurationError, match="the run allocation has 'gpu'"):
        check_shape(config, _queue(), sbatch_overrides(opts), opts)


def test_mem_asked_against_a_mem_per_cpu_allocation_differs() -> None:
    spec = _allocation(mem_per_cpu="1G")
    problems = shape_mismatches(spec, sbatch_overrides({"mem": "8G"}))
    assert problems == ["mem: the step asks for '8G', the run allocation has None"]


def test_invalid_override_values_are_rejected_naming_the_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        shape_mismatches(_allocation(), sbatch_overrides({"time": "tomorrow"}))
    assert caught.value.field == "extra_slurm_opts['time']"  # the key as the user wrote it
    assert caught.value.value == "tomorrow"


def test_unknown_extra_slurm_opts_key_is_rejected_by_the_overrides() -> None:
    with pytest.raises(ConfigurationError) as caught:
        sbatch_overrides({"walltime": "10"})
    assert caught.value.field == "extra_slurm_opts['walltime']"


def test_the_same_memory_in_another_unit_is_not_a_mismatch() -> None:
    assert shape_mismatches(_allocation(), sbatch_overrides({"mem": "8192M"})) == []
