"""Successor policy and extension points against an in-memory cluster and a fake clock.

Policy: while a successor is outstanding and the session has no live head (the predecessor
ended before the promotion), using the session's allocation submits nothing and raises an
error naming the successor, its state and promote_successor(); a successor that is over
no longer blocks a new head; an allocation that is ending (COMPLETING) is waited out, never
attached to. Extension points: a subclass's own state, configuration and
SSH resource stay on the one session object through submission, promotion and attachment,
every allocation object comes from ``make_allocation`` and a successor's configuration
from ``clone_allocation_config``; resources build sessions of their ``session_class``.
The heartbeat thread beats while the caller waits for a successor and is gone after
teardown, with or without cancelling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from session_fakes import FakeCluster

from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.allocation import SlurmAllocation
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.head.successor import inherit_config
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.slurm.states import JobState

RUN_ID = "5e0c7a11-2222-4b6e-9f0e-2b3c4d5e6f72"
LICENSE = "--licenses=fluent:1"
CONFIG: dict[str, Any] = {"time_limit": "01:00:00", "signal_before_timeout": "USR1@60",
                          "extra_sbatch_directives": [LICENSE]}


def _slurm() -> SlurmResource:
    return SlurmResource(
        ssh=SSHConnectionResource(host="login.invalid", user="u"),
        remote_base="/cluster/ds",
        queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G"),
    )


class SiteAllocation(SlurmAllocation):
    """An allocation subclass carrying a site label given by its session."""

    site: str = ""


class SiteSession(RunSession):
    """A session subclass with its own state, allocation class and config inheritance."""

    def __init__(self, *args: Any, site: str = "hpc-a", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.site = site
        self.made: list[str] = []
        self.cloned: list[Mapping[str, Any]] = []

    def make_allocation(self, job_id: str, nodes: tuple[str, ...], values: Mapping[str, Any],
                         config: Mapping[str, Any] | None = None) -> SlurmAllocation:
        base = super().make_allocation(job_id, nodes, values, config)
        allocation = SiteAllocation(
            base.scheduler, base.paths, base.job_name, base.job_id, nodes=base.nodes,
            head=base.head, ray_address=base.ray_address, drain_signal=base.drain_signal,
            poll_interval=base.poll_interval, clock=base.clock, sleep=base.sleep)
        allocation.site = self.site
        self.made.append(job_id)
        return allocation

    def clone_allocation_config(self, current: Mapping[str, Any],
                                 given: SlurmRunAllocationConfig) -> SlurmRunAllocationConfig:
        self.cloned.append(dict(current))
        merged = super().clone_allocation_config(current, given)
        carried = [d for d in current.get("extra_sbatch_directives", [])
                   if d.startswith("--licenses=")]
        directives = list(merged.extra_sbatch_directives) + [
            d for d in carried if d not in merged.extra_sbatch_directives]
        return merged.model_copy(update={"extra_sbatch_directives": directives})


def _build(cls: type[RunSession] = RunSession, cluster: FakeCluster | None = None,
           slurm: SlurmResource | None = None) -> tuple[RunSession, FakeCluster]:
    slurm = slurm or _slurm()
    config = SlurmRunAllocationConfig(**CONFIG)
    probe = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None)
    cluster = cluster or FakeCluster(probe.initial_document())
    session = cls(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None,
                  io=cluster, clock=cluster.clock.monotonic, sleep=cluster.clock.sleep,
                  background=False)
    return session, cluster


def _running_head(cls: type[RunSession] = RunSession) -> tuple[RunSession, FakeCluster, str]:
    session, cluster = _build(cls)
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    head = session.ensure().job_id
    cluster.on_submit = None
    return session, cluster, head


def _start_on_promotion(cluster: FakeCluster, job_id: str) -> None:
    cluster.on_write = lambda files: cluster.clock.at(cluster.clock.t + 2,
                                                      lambda: cluster.start(job_id, nodes=("c2",)))


def _predecessor_ended(session: RunSession, cluster: FakeCluster, head: str) -> None:
    cluster.end(head, JobState.TIMEOUT)
    session.forget(session.allocation, "TIMEOUT")


# -- policy: no new head while a successor is outstanding -------------------------------------
def test_no_new_head_while_a_pending_successor_is_outstanding() -> None:
    session, cluster, head = _running_head()
    successor = session.submit_successor()
    cluster.jobs[successor.job_id].reason = "Resources"
    _predecessor_ended(session, cluster, head)
    with pytest.raises(SessionError) as refused:
        session.allocation  # noqa: B018 - the property submits or attaches
    message = str(refused.value)
    assert f"job {successor.job_id} (PENDING, reason Resources)" in message
    assert "session.promote_successor()" in message and "once it is RUNNING" in message
    assert len(cluster.specs) == 2  # the first head and the successor: nothing new
    assert cluster.doc()["successor"]["job_id"] == successor.job_id


def test_a_running_successor_is_named_and_promotion_stays_with_the_application() -> None:
    session, cluster, head = _running_head()
    successor = session.submit_successor()
    cluster.run_without_ready(successor.job_id)
    _predecessor_ended(session, cluster, head)
    with pytest.raises(SessionError, match=rf"job {successor.job_id} \(RUNNING\).*promote it "
                                           r"now with session\.promote_successor\(\)"):
        session.ensure()
    assert cluster.calls.get("write_files", 0) == 0  # not promoted behind the caller's back
    _start_on_promotion(cluster, successor.job_id)
    promoted = session.promote_successor()
    assert session.allocation is promoted and promoted.job_id == successor.job_id
    assert len(cluster.specs) == 2


def test_a_fresh_process_is_refused_once_it_sees_the_predecessor_ended() -> None:
    session, cluster, head = _running_head()
    successor = session.submit_successor()
    cluster.end(head, JobState.TIMEOUT)  # the head record still says READY
    fresh, _ = _build(cluster=cluster)
    with pytest.raises(SessionError, match=f"outstanding successor, job {successor.job_id}"):
        fresh.ensure()
    doc = cluster.doc()
    assert doc["history"][head]["final_state"] == "TIMEOUT" and "allocation" not in doc
    assert len(cluster.specs) == 2


def test_an_unanswered_squeue_refuses_too() -> None:
    session, cluster, head = _running_head()
    successor = session.submit_successor()
    _predecessor_ended(session, cluster, head)
    cluster.queue_answers = False
    with pytest.raises(SessionError, match=rf"job {successor.job_id} \(state unknown: the "
                                           "scheduler did not answer"):
        session.ensure()
    assert len(cluster.specs) == 2


def test_a_successor_that_is_over_no_longer_blocks_a_new_head() -> None:
    session, cluster, head = _running_head()
    successor = session.submit_successor()
    _predecessor_ended(session, cluster, head)
    cluster.end(successor.job_id, JobState.CANCELLED)
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    allocation = session.ensure()
    assert allocation.job_id not in (head, successor.job_id) and len(cluster.specs) == 3
    assert cluster.doc()["history"][successor.job_id]["final_state"] == "CANCELLED"


def test_an_ending_allocation_is_waited_out_never_attached_to() -> None:
    session, cluster, head = _running_head()
    successor = session.submit_successor()
    cluster.jobs[head].state = JobState.COMPLETING  # its ready file is still there
    ends_at = cluster.clock.t + 5
    cluster.clock.at(ends_at, lambda: cluster.end(head, JobState.CANCELLED))
    fresh, _ = _build(cluster=cluster)
    with pytest.raises(SessionError, match=f"outstanding successor, job {successor.job_id}"):
        fresh.ensure()
    assert cluster.clock.t >= ends_at
    assert cluster.doc()["history"][head]["final_state"] == "CANCELLED"


def test_without_a_successor_an_ending_allocation_is_replaced_once_it_ended() -> None:
    session, cluster, head = _running_head()
    cluster.jobs[head].state = JobState.COMPLETING
    cluster.clock.at(cluster.clock.t + 5, lambda: cluster.end(head, JobState.CANCELLED))
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    fresh, _ = _build(cluster=cluster)
    assert fresh.ensure().job_id not in (head, "")
    assert cluster.doc()["history"][head]["final_state"] == "CANCELLED"


# -- extension points --------------------------------------------------------------------------
def test_a_subclass_keeps_its_state_and_makes_every_allocation() -> None:
    session, cluster, head = _running_head(SiteSession)
    assert isinstance(session, SiteSession)
    slurm, config = session.slurm, session.config
    first = session.allocation
    assert isinstance(first, SiteAllocation) and first.site == "hpc-a"
    successor = session.submit_successor(SlurmRunAllocationConfig(time_limit="00:30:00"))
    # the hook saw the current allocation's recorded configuration and carried the license
    assert session.cloned[-1]["extra_sbatch_directives"] == [LICENSE]
    assert successor.config.extra_sbatch_directives == [LICENSE]
    assert list(cluster.specs[-1].extra_directives or ()) == [LICENSE]
    assert cluster.doc()["successor"]["config"]["extra_sbatch_directives"] == [LICENSE]
    cluster.run_without_ready(successor.job_id)
    _start_on_promotion(cluster, successor.job_id)
    promoted = session.promote_successor()
    assert isinstance(promoted, SiteAllocation) and promoted.site == "hpc-a"
    assert session.made == [head, successor.job_id]
    assert session.slurm is slurm and session.config is config  # public configuration kept
    # another process of the run attaches to the promoted allocation through the hook too
    other, _ = _build(SiteSession, cluster, slurm)
    attached = other.ensure()
    assert isinstance(attached, SiteAllocation) and attached.job_id == successor.job_id
    assert other.made == [successor.job_id] and other.slurm is slurm


def test_the_default_clone_never_repeats_extra_directives() -> None:
    session, cluster, _ = _running_head()
    successor = session.submit_successor()
    assert successor.config.extra_sbatch_directives == []
    assert list(cluster.specs[-1].extra_directives or ()) == []


class SiteConfig(SlurmRunAllocationConfig):
    """A configuration subclass with an operational field of its own."""

    license: str | None = None


def test_inheritance_keeps_a_config_subclass_and_its_fields() -> None:
    current = SiteConfig(time_limit="01:00:00", license="fluent:1").snapshot()
    merged = inherit_config(current, SiteConfig(time_limit="00:20:00"))
    assert type(merged) is SiteConfig
    assert (merged.license, merged.time_limit) == ("fluent:1", "00:20:00")
    plain = inherit_config(current, SlurmRunAllocationConfig())
    assert type(plain) is SlurmRunAllocationConfig and plain.time_limit == "01:00:00"


def test_resources_build_sessions_of_their_session_class() -> None:
    from dagster_slurm.compute.resource import ComputeResource
    from dagster_slurm.session.frontend.lifecycle import sessions_of_run
    from dagster_slurm.session.frontend.resource import SlurmSessionResource

    class SiteSessionResource(SlurmSessionResource):
        session_class = SiteSession

    class SiteCompute(ComputeResource):
        session_class = SiteSession

    context = SimpleNamespace(run=SimpleNamespace(run_id="9a8b7c6d-0000-4000-8000-000000000001"),
                              instance=None, log=None)
    resource = SiteSessionResource(slurm=_slurm())
    session = resource.get_session(context)
    assert type(session) is SiteSession and session.slurm is resource.slurm
    assert resource.get_session(context) is session  # one per run and process
    compute = SiteCompute(mode="slurm", slurm=_slurm(), allocation_scope="run")
    assert type(compute.get_run_allocation_session(context, start=False)) is SiteSession
    other = SimpleNamespace(run=SimpleNamespace(run_id="9a8b7c6d-0000-4000-8000-000000000002"),
                            instance=None, log=None)
    assert type(SlurmSessionResource(slurm=_slurm()).get_session(other)) is RunSession
    for ctx in (context, other):  # leave this process's registry as it was
        sessions_of_run(ctx.run.run_id)


# -- the heartbeat thread ------------------------------------------------------------------------
def _beating_session() -> tuple[RunSession, FakeCluster]:
    slurm = _slurm()
    config = SlurmRunAllocationConfig(**CONFIG, heartbeat_interval=0.02)
    probe = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None)
    cluster = FakeCluster(probe.initial_document())
    session = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None,
                         io=cluster, clock=cluster.clock.monotonic, sleep=cluster.clock.sleep)
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    return session, cluster


def _heartbeat_threads(session: RunSession) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith(session.job_name)]


def _beats_reach(cluster: FakeCluster, count: int) -> bool:
    deadline = time.monotonic() + 10
    while len(cluster.beats) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("cancel", [False, True])
def test_teardown_stops_the_heartbeat_whether_or_not_it_keeps_the_allocations(
        cancel: bool) -> None:
    session, cluster = _beating_session()
    head = session.ensure().job_id
    successor = session.submit_successor()  # the caller now waits for it: beats go on
    assert _beats_reach(cluster, len(cluster.beats) + 3)
    assert len(_heartbeat_threads(session)) == 1
    session.close(cancel=cancel, reason="test")
    assert _heartbeat_threads(session) == []  # stopped and joined: no beat follows
    kept = {head, successor.job_id} - set(cluster.cancelled)
    assert kept == (set() if cancel else {head, successor.job_id})
