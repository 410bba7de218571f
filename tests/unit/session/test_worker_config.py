"""SlurmWorkerAllocationConfig: validation, inheritance, and the separate head's request."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.worker_config import (
    INHERITED_FIELDS,
    PER_SUBMISSION_FIELDS,
    SlurmWorkerAllocationConfig,
    check_head_allocation,
    first_worker_config,
    head_queue_config,
    resolve_worker_config,
)
from dagster_slurm.slurm.queue import SlurmQueueConfig


def _queue(**overrides: Any) -> SlurmQueueConfig:
    values: dict[str, Any] = {
        "partition": "gpu", "num_nodes": 2, "cpus": 16, "gpus_per_node": 4, "mem": "64G",
        "time_limit": "08:00:00", "time_min": "04:00:00", "qos": "normal", "account": "proj",
        "reservation": "res1", "signal_before_timeout": "USR1@120",
        "extra_sbatch_directives": ["--constraint=a100"],
    }
    values.update(overrides)
    return SlurmQueueConfig(**values)


def _head() -> SlurmRunAllocationConfig:
    return SlurmRunAllocationConfig(partition="cpu", time_limit="3-00:00:00")


def _message(**kwargs: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        SlurmWorkerAllocationConfig(**kwargs)
    return str(caught.value)


# -- validation -------------------------------------------------------------------------------
def test_the_config_is_frozen_and_names_unknown_fields() -> None:
    config = SlurmWorkerAllocationConfig(partition="gpu")
    with pytest.raises(Exception, match="does not support item assignment"):
        config.partition = "cpu"  # type: ignore[misc]
    assert "unknown field 'gpus_per_nod'; did you mean 'gpus_per_node'?" in _message(
        gpus_per_nod=2)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"num_nodes": 0}, "num_nodes=0: must be at least 1"),
        ({"cpus_per_task": "many"}, "cpus_per_task"),
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"partition": "a b"}, "partition='a b'"),
        ({"mem": "lots"}, "mem='lots'"),
        ({"time_limit": "soon"}, "time_limit='soon'"),
        ({"signal_before_timeout": "KILL@60"}, "signal_before_timeout='KILL@60'"),
        ({"time_limit": "10", "time_min": "20"}, "time_min='00:20:00': must not exceed"),
        ({"extra_sbatch_directives": ["--partition=x"]}, "extra_sbatch_directives[0]"),
        ({"extra_sbatch_directives": ["--cpus-per-task=3"]}, "cpus_per_task"),
        ({"nodelist": "g1 g2"}, "nodelist='g1 g2'"),
        ({"ray_resources": {"CPU": 1}}, "ray_resources['CPU']"),
        ({"ray_resources": {"node:10.0.0.1": 1}}, "ray_resources['node:10.0.0.1']"),
        ({"ray_resources": {"dagster_slurm_worker": 1}}, "ray_resources['dagster_slurm_worker']"),
        ({"ray_resources": {"a b": 1}}, "resource name 'a b'"),
        ({"ray_resources": {"x": 0}}, "ray_resources['x']=0.0: must be a positive"),
        ({"ray_start_args": ["--address=h:1"]}, "ray_start_args[0]='--address=h:1'"),
        ({"ray_start_args": ["--resources={}"]}, "use ray_resources"),
        ({"ray_start_args": ["-v"]}, "ray_start_args[0]"),
        ({"rejoin_timeout": 0}, "rejoin_timeout=0"),
        ({"rejoin_timeout": float("inf")}, "rejoin_timeout=inf"),
    ],
)
def test_invalid_values_name_the_field_and_the_value(kwargs: dict[str, Any], expected: str) -> None:
    assert expected in _message(**kwargs)


def test_valid_values_and_overridable_ray_options() -> None:
    config = SlurmWorkerAllocationConfig(
        partition="GPU-a40", num_nodes=1, gpus_per_node=4, cpus_per_task=32, mem="200G",
        time_limit="08:00:00", signal_before_timeout="TERM@600", nodelist="g[1-2]",
        ray_resources={"accelerator:a40": 1, "vram_48gb": 1},
        ray_start_args=["--num-cpus=8", "--object-store-memory=100000000", "--num-gpus=2"],
    )
    assert config.ray_resources == {"accelerator:a40": 1.0, "vram_48gb": 1.0}
    assert config.rejoin_timeout == 600.0
    assert config.snapshot()["ray_start_args"][0] == "--num-cpus=8"
    assert SlurmWorkerAllocationConfig(**config.snapshot()) == config


# -- inheritance -------------------------------------------------------------------------------
def test_without_a_first_worker_every_slurm_field_comes_from_the_head() -> None:
    head = _queue()
    resolved = resolve_worker_config(SlurmWorkerAllocationConfig(), None, head)
    for own, queue_field in INHERITED_FIELDS.items():
        assert getattr(resolved, own) == getattr(head, queue_field), own
    assert resolved.extra_sbatch_directives == []  # never inherited


def test_the_first_worker_is_the_source_when_there_is_one() -> None:
    first = SlurmWorkerAllocationConfig(
        partition="GPU-rtx6000", num_nodes=1, cpus_per_task=8, gpus_per_node=3, mem="100G",
        time_limit="08:00:00", signal_before_timeout="TERM@600", qos="gpu", account="a2",
        nodelist="g1", extra_sbatch_directives=["--constraint=rtx"],
        ray_resources={"accelerator:rtx": 1}, ray_start_args=["--num-cpus=4"],
        rejoin_timeout=900,
    )
    resolved = resolve_worker_config(SlurmWorkerAllocationConfig(partition="GPU-a40"), first,
                                     _queue())
    assert resolved.partition == "GPU-a40"
    assert (resolved.cpus_per_task, resolved.gpus_per_node, resolved.mem) == (8, 3, "100G")
    assert (resolved.qos, resolved.account, resolved.reservation) == ("gpu", "a2", None)
    assert resolved.signal_before_timeout == "TERM@600"
    # per submission only: never from the first worker
    for name in PER_SUBMISSION_FIELDS:
        assert getattr(resolved, name) == SlurmWorkerAllocationConfig.model_fields[name].get_default(
            call_default_factory=True), name


@pytest.mark.parametrize(("own", "other"), [("mem", "mem_per_cpu"), ("mem_per_cpu", "mem")])
def test_memory_of_either_form_replaces_the_inherited_one(own: str, other: str) -> None:
    source = _queue(**{other: "2G", own: None})
    resolved = resolve_worker_config(SlurmWorkerAllocationConfig(**{own: "8G"}), None, source)
    assert (getattr(resolved, own), getattr(resolved, other)) == ("8G", None)
    spec = resolved.to_sbatch_spec("j", "s")
    assert (getattr(spec, own), getattr(spec, other)) == ("8G", None)
    inherited = resolve_worker_config(SlurmWorkerAllocationConfig(), None, source)
    assert (getattr(inherited, own), getattr(inherited, other)) == (None, "2G")


def test_an_inherited_combination_that_does_not_hold_names_its_origin() -> None:
    first = resolve_worker_config(SlurmWorkerAllocationConfig(), None, _queue())
    with pytest.raises(ConfigurationError) as caught:
        resolve_worker_config(SlurmWorkerAllocationConfig(time_limit="60"), first, _queue())
    assert caught.value.field == "time_min"
    assert "time_min, signal_before_timeout inherited from the first worker allocation" in str(
        caught.value)
    fine = resolve_worker_config(SlurmWorkerAllocationConfig(time_limit="60", time_min="30"),
                                 first, _queue())
    assert (fine.time_limit, fine.time_min) == ("01:00:00", "00:30:00")


def test_a_resolved_config_becomes_its_own_request_without_the_queue() -> None:
    head = head_queue_config(_queue(), _head())
    resolved = resolve_worker_config(SlurmWorkerAllocationConfig(partition="gpu",
                                                                 nodelist="g1"), None, head)
    spec = resolved.to_sbatch_spec("job", "script.sh")
    assert (spec.partition, spec.nodelist, spec.cpus_per_task, spec.signal) == (
        "gpu", "g1", 2, None)
    with pytest.raises(ValueError, match="resolve_worker_config first"):
        SlurmWorkerAllocationConfig(partition="gpu").to_queue_config()


def test_run_allocation_becomes_the_first_worker_with_the_queue_values() -> None:
    run = SlurmRunAllocationConfig(partition="GPU-rtx6000", gpus_per_node=3,
                                   time_limit="08:00:00", signal_before_timeout="TERM@600",
                                   extra_sbatch_directives=["--constraint=rtx"])
    first = first_worker_config(run, _queue())
    expected = run.queue_for(_queue())
    for own, queue_field in INHERITED_FIELDS.items():
        assert getattr(first, own) == getattr(expected, queue_field), own
    assert first.extra_sbatch_directives == ["--constraint=rtx"]
    assert first.to_sbatch_spec("j", "s") == expected.to_sbatch_spec("j", "s")


# -- the separate head -------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"time_limit": "10"}, "ray_head_allocation.partition"),
    ({"partition": "cpu"}, "ray_head_allocation.time_limit"),
])
def test_the_head_needs_an_explicit_partition_and_time_limit(kwargs: dict[str, Any],
                                                            field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_head_allocation(SlurmRunAllocationConfig(**kwargs))
    assert caught.value.field == field and field in str(caught.value)
    with pytest.raises(ConfigurationError, match=field):
        head_queue_config(_queue(), SlurmRunAllocationConfig(**kwargs))
    assert check_head_allocation(_head()) == _head()


def test_the_head_uses_its_defaults_and_only_the_queue_accounting() -> None:
    request = head_queue_config(_queue(), _head())
    assert (request.partition, request.time_limit) == ("cpu", "3-00:00:00")
    assert (request.num_nodes, request.cpus, request.mem, request.gpus_per_node) == (1, 2, "8G", 0)
    assert (request.account, request.qos, request.reservation) == ("proj", "normal", "res1")
    assert request.time_min is None and request.signal_before_timeout is None
    assert request.extra_sbatch_directives == [] and request.mem_per_cpu is None


def test_the_head_fields_replace_its_defaults_and_the_queue() -> None:
    head = SlurmRunAllocationConfig(partition="cpu", time_limit="1-00:00:00", cpus_per_task=4,
                                    mem_per_cpu="2G", account="other", qos="long",
                                    reservation="r2", gpus_per_node=1, num_nodes=1,
                                    signal_before_timeout="TERM@300")
    request = head_queue_config(_queue(), head)
    assert (request.cpus, request.mem, request.mem_per_cpu, request.gpus_per_node) == (
        4, None, "2G", 1)
    assert (request.account, request.qos, request.reservation) == ("other", "long", "r2")
    assert request.signal_before_timeout == "TERM@300"
    assert head_queue_config(_queue(), SlurmRunAllocationConfig(
        partition="", time_limit="10")).partition is None  # '' is the cluster's default
