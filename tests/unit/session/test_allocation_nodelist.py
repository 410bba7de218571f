"""SlurmRunAllocationConfig(nodelist=...): the run allocation asks for those nodes.

The published package's field: the allocation's sbatch request gets ``--nodelist``, a
successor asks for the same nodes, a step's shape check compares with it, and a run
allocation that becomes the first worker allocation (a separate head) keeps it.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from running_heads import RUN_ID, cpu_slurm
from session_fakes import FakeCluster

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.session.core.config import SlurmRunAllocationConfig, check_shape
from dagster_slurm.session.core.paths import session_digest
from dagster_slurm.session.core.worker_config import first_worker_config
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.commands import sbatch_argv
from dagster_slurm.slurm.queue import SlurmQueueConfig

PINNED = SlurmRunAllocationConfig(time_limit="01:00:00", nodelist="gpu-[01-02]")


def test_the_allocation_request_names_the_nodes() -> None:
    session = RunSession(cpu_slurm(), RUN_ID, PINNED, BashLauncher(), activation=lambda: None)
    assert session.context.spec.nodelist == "gpu-[01-02]"
    assert "--nodelist=gpu-[01-02]" in sbatch_argv(session.context.spec)
    free = RunSession(cpu_slurm(), RUN_ID, SlurmRunAllocationConfig(time_limit="01:00:00"),
                      BashLauncher(), activation=lambda: None)
    assert free.context.spec.nodelist is None


def test_a_successor_asks_for_the_same_nodes() -> None:
    probe = RunSession(cpu_slurm(), RUN_ID, PINNED, BashLauncher(), activation=lambda: None)
    cluster = FakeCluster(probe.initial_document())
    session = RunSession(cpu_slurm(), RUN_ID, PINNED, BashLauncher(), activation=lambda: None,
                         io=cluster, clock=cluster.clock.monotonic, sleep=cluster.clock.sleep,
                         background=False)
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    session.ensure()
    cluster.on_submit = None
    successor = session.submit_successor(SlurmRunAllocationConfig(time_limit="00:30:00"))
    assert successor.config.nodelist == "gpu-[01-02]"
    assert cluster.specs[-1].nodelist == "gpu-[01-02]"


def test_a_step_is_checked_against_the_pinned_nodes() -> None:
    queue = SlurmQueueConfig(partition="gpu")
    assert check_shape(PINNED, queue, {"nodelist": "gpu-[01-02]"}, None).nodelist == "gpu-[01-02]"
    with pytest.raises(ConfigurationError, match="nodelist: the step asks for 'gpu-03'"):
        check_shape(PINNED, queue, {"nodelist": "gpu-03"}, {"nodelist": "gpu-03"})


def test_a_run_allocation_that_becomes_the_first_worker_keeps_its_nodes() -> None:
    first = first_worker_config(PINNED, SlurmQueueConfig(partition="gpu"))
    assert first.nodelist == "gpu-[01-02]"
    assert first.to_sbatch_spec("w", "/s").nodelist == "gpu-[01-02]"


def test_the_value_is_checked_and_unset_keeps_earlier_digests() -> None:
    with pytest.raises(ValidationError, match="nodelist"):
        SlurmRunAllocationConfig(nodelist="gpu 01")
    plain = SlurmRunAllocationConfig(time_limit="01:00:00")
    assert "nodelist" not in plain.snapshot() and PINNED.snapshot()["nodelist"] == "gpu-[01-02]"
    queue = SlurmQueueConfig()
    assert session_digest(queue, plain, RayLauncher(), None, None) != session_digest(
        queue, PINNED, RayLauncher(), None, None)
