"""Sessions with a separate head (a ``RunLayout``) on the in-memory cluster of
``session_fakes``, and a stand-in for the worker submission (no tests here).

The setups the separate-head and worker-settling tests share: one run (:data:`RUN_ID`)
whose head is :data:`HEAD` on a compute queue none of whose shape may reach the head
(:func:`separate_head_slurm`), with :data:`WORKERS` as the first worker allocation.
"""

from __future__ import annotations

from typing import Any

from session_fakes import FakeCluster, FakeJob

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.head.layout import RunLayout
from dagster_slurm.session.session import RunSession
from dagster_slurm.session.workers.keep import WORKER_LEASE
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt

RUN_ID = "7c1d2e3f-4a5b-4c6d-8e7f-901234567890"

#: The separate head's request (``ray_head_allocation``).
HEAD = SlurmRunAllocationConfig(partition="cpu", mem="1500M", time_limit="00:10:00")
#: The first worker allocation (``run_allocation`` of a ComputeResource with a separate head).
WORKERS = SlurmRunAllocationConfig(partition="gpu", gpus_per_node=1, time_limit="01:30:00")


def _compute_queue() -> SlurmQueueConfig:
    """A compute queue: none of its shape may reach a separate head."""
    return SlurmQueueConfig(partition="gpu", num_nodes=2, cpus=8, gpus_per_node=2, mem="64G",
                            time_limit="02:00:00", time_min="01:00:00",
                            signal_before_timeout="USR1@120", account="proj", qos="high",
                            reservation="maint", extra_sbatch_directives=["--constraint=a100"])


def separate_head_slurm() -> SlurmResource:
    """A SlurmResource with the compute queue (its login node is never reached)."""
    return SlurmResource(ssh=SSHConnectionResource(host="login.invalid", user="u"),
                         remote_base="/cluster/ds", queue=_compute_queue())


def separate_head_compute(**kwargs: Any) -> ComputeResource:
    """A run-scope ComputeResource with a RayLauncher, :data:`HEAD` as its
    ``ray_head_allocation`` and :data:`WORKERS` as its ``run_allocation``; ``kwargs``
    override any field."""
    values: dict[str, Any] = dict(mode="slurm", slurm=separate_head_slurm(),
                                  allocation_scope="run", default_launcher=RayLauncher(),
                                  ray_head_allocation=HEAD, run_allocation=WORKERS)
    values.update(kwargs)
    return ComputeResource(**values)


def separate_head_layout() -> RunLayout:
    """The layout of :func:`separate_head_compute`'s run session."""
    layout = separate_head_compute().run_layout()
    assert layout is not None
    return layout


def layout_session(layout: RunLayout | None, launcher: RayLauncher | None = None,
                   config: SlurmRunAllocationConfig = HEAD) -> tuple[RunSession, FakeCluster]:
    """A session of :data:`RUN_ID` laid out by ``layout`` (None: no layout) on a fresh
    in-memory cluster; ``launcher`` None: a RayLauncher with 2 GPUs per node."""
    slurm = separate_head_slurm()
    launcher = launcher or RayLauncher(num_gpus_per_node=2)
    extra: dict[str, Any] = {} if layout is None else {"layout": layout}
    probe = RunSession(slurm, RUN_ID, config, launcher, activation=lambda: None, **extra)
    cluster = FakeCluster(probe.initial_document())
    session = RunSession(slurm, RUN_ID, config, launcher, activation=lambda: None, io=cluster,
                         clock=cluster.clock.monotonic, sleep=cluster.clock.sleep, **extra,
                         background=False)
    return session, cluster


class WorkerSubmitter:
    """A stand-in for ``add_worker_allocation``: records the submission in the fake cluster
    the way the agent's submit operation does (a worker record under a job of the session's
    job name); ``calls`` keeps the configuration of each submission. Asserts that the
    caller holds the worker lease."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.calls: list[SlurmWorkerAllocationConfig] = []

    def __call__(self, session: Any, config: SlurmWorkerAllocationConfig,
                 logger: Any, fence: Any = None) -> str:
        self.calls.append(config)
        held = (self.cluster.doc().get("leases") or {}).get(WORKER_LEASE)
        assert held is not None, "submitted without holding the lease"
        token = f"tok-{len(self.calls)}"
        job_id = str(self.cluster.next_id)
        self.cluster.next_id += 1
        submit = wt.submit_worker(self._document(), token=token, config=config.snapshot(),
                                  shape={}, job_name=session.job_name)
        assert isinstance(submit, wt.Change), submit
        assert self.cluster.store.transact(submit.patch).ok
        done = wt.worker_submitted(self._document(), token=token, job_id=job_id)
        assert isinstance(done, wt.Change), done
        assert self.cluster.store.transact(done.patch).ok
        self.cluster.jobs[job_id] = FakeJob(job_id, session.job_name, token)
        return job_id

    def _document(self) -> Any:
        return tr.document(self.cluster.doc())


def ready_head(layout: RunLayout | None = None
               ) -> tuple[RunSession, FakeCluster, WorkerSubmitter]:
    """A session laid out by ``layout`` (None: :func:`separate_head_layout`) whose head,
    once submitted, runs 1 s later with a Ray address; and a :class:`WorkerSubmitter` on
    its cluster. Nothing is submitted yet."""
    session, cluster = layout_session(layout or separate_head_layout())
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 1, lambda: cluster.start(job.job_id, ray_address="10.0.0.1:6379"))
    submitter = WorkerSubmitter(cluster)
    return session, cluster, submitter
