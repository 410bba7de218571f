"""The script of a separate head, run with bash against the stub cluster commands of
``ray_stubs.py``: its one Ray node offers no CPUs and no GPUs (``--num-cpus=0
--num-gpus=0`` reach ``ray start``), whatever the run's launcher offers on worker nodes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from ray_stubs import ENV_PAYLOAD, StubCluster, kill_stub_processes, options

from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.head.layout import RunLayout

#: The port range of this module's stub Ray heads (see ray_stubs).
PORTS = (30000, 30499)


@pytest.fixture
def cluster(tmp_path: Path):
    stub = StubCluster.create(tmp_path, ports=PORTS)
    yield stub
    kill_stub_processes(stub)


@pytest.mark.parametrize("values", [{}, {"num_cpus_per_node": 8, "num_gpus_per_node": 4}])
def test_the_head_node_offers_no_cpus_and_no_gpus(cluster: StubCluster,
                                                  values: dict[str, int]) -> None:
    launcher = cluster.launcher(**values)
    head = RunLayout(first_worker=SlurmWorkerAllocationConfig()).head_launcher(launcher)
    plan = cluster.plan(ENV_PAYLOAD)
    script = cluster.write(head, dataclasses.replace(plan, num_nodes=1))
    result = cluster.run(script, STUB_HOSTS="c1", SLURM_JOB_NODELIST="c1",
                         SLURM_JOB_CPUS_PER_NODE="2", SLURM_GPUS_ON_NODE="0")
    assert result.returncode == 0, result.stderr
    argv = cluster.ray_argv("c1")
    opts = options(argv)
    assert "--head" in argv
    assert (opts["num-cpus"], opts["num-gpus"]) == ("0", "0")
    assert opts["resources"] == '{"dagster_slurm_head": 1}'
    assert "warning" not in result.stderr
    # the run's launcher is unchanged: worker nodes still offer its values
    assert (launcher.num_cpus_per_node, launcher.num_gpus_per_node) == (
        values.get("num_cpus_per_node"), values.get("num_gpus_per_node", 0))
