"""Run sessions on the in-memory cluster of ``session_fakes`` whose head allocation runs (no
tests here).

The setups the successor, head election, promotion-tag and worker-head tests share: one run
(:data:`RUN_ID`) on a ``cpu`` queue (:func:`cpu_slurm`) with :data:`CONFIG`, each session on
the cluster's fake clock and without a heartbeat thread.
"""

from __future__ import annotations

from typing import Any

from session_fakes import FakeCluster

from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.queue import SlurmQueueConfig

RUN_ID = "7d1f0c2e-1111-4a6e-8f0e-1b2c3d4e5f61"
#: The head allocation's settings: one hour, USR1 60 s before the walltime, one extra
#: directive (which a successor never inherits).
CONFIG: dict[str, Any] = {"time_limit": "01:00:00", "signal_before_timeout": "USR1@60",
                          "extra_sbatch_directives": ["--begin=now"]}


def cpu_slurm() -> SlurmResource:
    """A SlurmResource whose queue is one ``cpu`` node with 8G (its login node is never
    reached: the sessions use the in-memory cluster)."""
    return SlurmResource(
        ssh=SSHConnectionResource(host="login.invalid", user="u"),
        remote_base="/cluster/ds",
        queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G"),
    )


def new_session(cluster: FakeCluster | None = None) -> tuple[RunSession, FakeCluster]:
    """A BashLauncher session of :data:`RUN_ID` with :data:`CONFIG` on ``cluster`` (None: a
    fresh one; pass another session's cluster for a second process of the same run).

    Every publication of the run's allocation tag is recorded in ``session.published``."""
    slurm = cpu_slurm()
    config = SlurmRunAllocationConfig(**CONFIG)
    probe = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None)
    cluster = cluster or FakeCluster(probe.initial_document())
    session = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None,
                         io=cluster, clock=cluster.clock.monotonic, sleep=cluster.clock.sleep,
                         background=False)
    published: list[str] = []
    session.publish_allocation = published.append
    session.published = published  # type: ignore[attr-defined]
    return session, cluster


def running_head() -> tuple[RunSession, FakeCluster, str]:
    """:func:`new_session` with its head submitted and running (it started 1 s after sbatch
    answered): the session, its cluster and the head's job id. Later submissions do not
    start by themselves."""
    session, cluster = new_session()
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    head = session.ensure().job_id
    cluster.on_submit = None
    return session, cluster, head


def ray_running_head() -> tuple[RunSession, FakeCluster, str]:
    """As :func:`running_head`, with a RayLauncher and a one-hour head only: the head's step
    server reports a Ray address (so the session reads the Ray markers)."""
    config = SlurmRunAllocationConfig(time_limit="01:00:00")
    probe = RunSession(cpu_slurm(), RUN_ID, config, RayLauncher(), activation=lambda: None)
    cluster = FakeCluster(probe.initial_document())
    session = RunSession(cpu_slurm(), RUN_ID, config, RayLauncher(), activation=lambda: None,
                         io=cluster, clock=cluster.clock.monotonic, sleep=cluster.clock.sleep,
                         background=False)
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 1, lambda: cluster.start(job.job_id, ray_address="10.0.0.1:6379"))
    head = session.ensure().job_id
    cluster.on_submit = None
    return session, cluster, head


def start_on_promotion(cluster: FakeCluster, job_id: str) -> None:
    """The successor ``job_id``'s step server reports ready (on node ``c2``) 2 s after the
    start script is written."""
    cluster.on_write = lambda files: cluster.clock.at(cluster.clock.t + 2,
                                                      lambda: cluster.start(job_id, nodes=("c2",)))
