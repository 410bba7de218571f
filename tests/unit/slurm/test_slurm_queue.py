from __future__ import annotations

from typing import Any

import pytest
from dagster import ConfigurableResource, Definitions, asset, materialize
from pydantic import Field, ValidationError

from dagster_slurm.slurm.commands import SbatchSpec, sbatch_argv
from dagster_slurm.slurm.queue import SlurmQueueConfig


def test_defaults() -> None:
    queue = SlurmQueueConfig()
    assert queue.partition is None
    assert queue.num_nodes == 1
    assert queue.time_limit == "00:30:00"
    assert queue.cpus == 2
    assert queue.gpus_per_node == 0
    assert queue.mem == "4096M"
    assert queue.mem_per_cpu is None
    assert queue.qos is None and queue.reservation is None and queue.account is None
    assert queue.signal_before_timeout is None and queue.time_min is None
    assert queue.extra_sbatch_directives == []


def test_values_are_normalised() -> None:
    queue = SlurmQueueConfig(
        partition="",
        time_limit="90",
        time_min="45",
        signal_before_timeout="sigterm",
    )
    assert queue.partition is None  # '' means the cluster's default partition
    assert queue.time_limit == "01:30:00"
    assert queue.time_min == "00:45:00"
    assert queue.signal_before_timeout == "TERM@60"  # Slurm's default lead time made explicit


def test_to_sbatch_spec_maps_every_field() -> None:
    queue = SlurmQueueConfig(
        partition="gpu",
        num_nodes=2,
        time_limit="20:00:00",
        time_min="04:00:00",
        signal_before_timeout="TERM@120",
        cpus=8,
        gpus_per_node=4,
        mem="64G",
        qos="normal",
        reservation="r1",
        account="proj",
        extra_sbatch_directives=["--constraint=a100"],
    )
    spec = queue.to_sbatch_spec("dg-run", "/runs/1/job.sh", comment="tok-1")
    assert spec == SbatchSpec(
        job_name="dg-run",
        script_path="/runs/1/job.sh",
        partition="gpu",
        qos="normal",
        account="proj",
        reservation="r1",
        time_limit="20:00:00",
        time_min="04:00:00",
        num_nodes=2,
        cpus_per_task=8,
        gpus_per_node=4,
        mem="64G",
        signal="B:TERM@120",
        comment="tok-1",
        extra_directives=("--constraint=a100",),
    )


def test_zero_gpus_and_no_partition_are_not_passed() -> None:
    argv = sbatch_argv(SlurmQueueConfig().to_sbatch_spec("j", "s"))
    assert not any(arg.startswith(("--gpus", "--partition", "--signal")) for arg in argv)
    assert "--mem=4096M" in argv


def test_mem_per_cpu_replaces_mem() -> None:
    spec = SlurmQueueConfig(mem_per_cpu="2G").to_sbatch_spec("j", "s")
    assert (spec.mem, spec.mem_per_cpu) == (None, "2G")
    spec = SlurmQueueConfig(mem=None).to_sbatch_spec("j", "s")
    assert (spec.mem, spec.mem_per_cpu) == (None, None)


def test_memory_overrides_replace_either_form() -> None:
    queue = SlurmQueueConfig(mem="8G")
    assert queue.to_sbatch_spec("j", "s", mem_per_cpu="1G").mem is None
    queue = SlurmQueueConfig(mem_per_cpu="1G")
    spec = queue.to_sbatch_spec("j", "s", mem="16G")
    assert (spec.mem, spec.mem_per_cpu) == ("16G", None)


def test_overrides_win_and_are_validated() -> None:
    queue = SlurmQueueConfig(partition="cpu")
    assert queue.to_sbatch_spec("j", "s", partition="gpu").partition == "gpu"
    with pytest.raises(TypeError, match="bogus"):
        queue.to_sbatch_spec("j", "s", bogus=1)
    with pytest.raises(TypeError, match="job_name"):
        queue.to_sbatch_spec("j", "s", **{"job_name": "other"})


def _error(**kwargs: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        SlurmQueueConfig(**kwargs)
    return str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"partition": "gpu; touch pwned"}, "partition='gpu; touch pwned'"),
        ({"qos": "a b"}, "qos='a b'"),
        ({"account": "$(id)"}, "account='$(id)'"),
        ({"reservation": "r|x"}, "reservation='r|x'"),
        ({"num_nodes": 0}, "num_nodes=0"),
        ({"cpus": -2}, "cpus=-2"),
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"time_limit": "0"}, "time_limit='0'"),
        ({"time_limit": "tomorrow"}, "time_limit='tomorrow'"),
        ({"time_min": "-5"}, "time_min='-5'"),
        ({"mem": "4 GB"}, "mem='4 GB'"),
        ({"mem_per_cpu": "x"}, "mem_per_cpu='x'"),
        ({"signal_before_timeout": "KILL@60"}, "no drain window"),
        ({"signal_before_timeout": "SIGSTOP"}, "no drain window"),
        ({"signal_before_timeout": "B:TERM@60"}, "without a prefix"),
        ({"signal_before_timeout": "TERM@abc"}, "signal_before_timeout='TERM@abc'"),
        ({"extra_sbatch_directives": ["--time=5"]}, "time_limit"),
        ({"extra_sbatch_directives": ["--wrap=id"]}, "extra_sbatch_directives[0]='--wrap=id'"),
        (
            {"extra_sbatch_directives": ["--begin=now", "--begin=now+1hour"]},
            "repeats --begin",
        ),
    ],
)
def test_invalid_values_name_field_and_value(kwargs: dict[str, Any], expected: str) -> None:
    assert expected in _error(**kwargs)


def test_time_relations() -> None:
    assert "must not exceed time_limit" in _error(time_limit="01:00:00", time_min="02:00:00")
    assert "lead time (120 s) must be shorter" in _error(
        time_limit="2", signal_before_timeout="TERM@120"
    )
    assert "longer than the signal's lead time" in _error(
        time_limit="01:00:00", time_min="2", signal_before_timeout="TERM@120"
    )
    SlurmQueueConfig(time_limit="UNLIMITED", time_min="10", signal_before_timeout="USR1@300")


class _ClusterResource(ConfigurableResource):  # type: ignore[type-arg]
    queue: SlurmQueueConfig = Field(default_factory=SlurmQueueConfig)


def test_nests_in_a_resource_and_reads_run_config() -> None:
    seen: list[list[str]] = []

    @asset
    def probe(cluster: _ClusterResource) -> None:
        seen.append(sbatch_argv(cluster.queue.to_sbatch_spec("dg-probe", "/s.sh")))

    Definitions(assets=[probe], resources={"cluster": _ClusterResource()})
    result = materialize(
        [probe],
        resources={"cluster": _ClusterResource()},
        run_config={
            "resources": {
                "cluster": {"config": {"queue": {"partition": "gpu", "time_limit": "2-0"}}}
            }
        },
    )
    assert result.success
    assert "--partition=gpu" in seen[0]
    assert "--time=2-00:00:00" in seen[0]
