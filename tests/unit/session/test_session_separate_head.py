"""A separate head (``ComputeResource(ray_head_allocation=...)``, ``SlurmSessionResource(
ray_head_only=True, ...)``): validation, the head's request and script, the session's digest,
and keeping a worker allocation (with the in-memory cluster of ``session_fakes``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from separate_heads import (
    HEAD,
    RUN_ID,
    WORKERS,
    WorkerSubmitter,
    layout_session,
    ready_head,
    separate_head_compute,
    separate_head_layout,
    separate_head_slurm,
)

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.errors import SchedulerError
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.frontend.lifecycle import sessions_of_run
from dagster_slurm.session.frontend.resource import SlurmSessionResource
from dagster_slurm.session.head.acquire import acquire_head
from dagster_slurm.session.session import RunSession
from dagster_slurm.session.workers import keep as workers_keep
from dagster_slurm.session.workers.keep import WORKER_LEASE, keep_a_worker
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import lease
from dagster_slurm.state import transitions as tr


def _context(run_id: str = RUN_ID) -> SimpleNamespace:
    return SimpleNamespace(run=SimpleNamespace(run_id=run_id), instance=None, log=None)


# -- validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "expected"), [
    (dict(allocation_scope="asset", run_allocation=None),
     "'time_limit': '00:10:00', 'partition': 'cpu'}: a separate head exists only for a "
     "run's shared allocation: set allocation_scope='run'"),
    (dict(default_launcher=BashLauncher()),
     "default_launcher='BashLauncher': ray_head_allocation runs the Ray head in its own "
     "allocation and needs a RayLauncher"),
    (dict(ray_head_allocation=SlurmRunAllocationConfig(time_limit="00:10:00")),
     "ray_head_allocation.partition=None: a separate head allocation needs an explicit partition"),
    (dict(ray_head_allocation=SlurmRunAllocationConfig(partition="cpu")),
     "ray_head_allocation.time_limit=None: a separate head allocation needs an explicit "
     "time_limit"),
    (dict(run_allocation=SlurmRunAllocationConfig(heartbeat_timeout=900)),
     "run_allocation.heartbeat_timeout=900.0: with ray_head_allocation set, the session's "
     "allocation is the head"),
    # the first worker allocation (run_allocation on the queue) is checked too
    (dict(run_allocation=SlurmRunAllocationConfig(time_limit="00:30:00")),
     "run_allocation.time_min='01:00:00': must not exceed time_limit='00:30:00'"),
])
def test_a_separate_head_that_cannot_work_is_refused_naming_the_field(
        kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError) as raised:
        separate_head_compute(**kwargs)
    assert expected in str(raised.value)
    assert str(raised.value).count("Value error, ") == 1


def test_a_separate_head_is_checked_in_local_mode_too() -> None:
    with pytest.raises(ValueError, match="ray_head_allocation.partition=None"):
        ComputeResource(mode="local", allocation_scope="run", default_launcher=RayLauncher(),
                        ray_head_allocation=SlurmRunAllocationConfig(time_limit="10"))


@pytest.mark.parametrize(("kwargs", "expected"), [
    (dict(worker_allocation=None),
     "worker_allocation=None: ray_head_only=True leaves the head without CPUs or GPUs"),
    (dict(num_nodes=2), "num_nodes=2: ray_head_only=True needs num_nodes=1"),
    (dict(num_nodes=None), "num_nodes=2: ray_head_only=True needs num_nodes=1"),  # the queue's
    (dict(run_allocation=SlurmRunAllocationConfig(num_nodes=2)),
     "num_nodes=1: differs from run_allocation.num_nodes=2; set one of the two"),
    (dict(launcher=BashLauncher()), "launcher='BashLauncher': ray_head_only needs a RayLauncher"),
    (dict(num_nodes=0), "num_nodes=0: must be at least 1"),
])
def test_ray_head_only_needs_a_worker_allocation_and_one_node(kwargs: dict[str, Any],
                                                              expected: str) -> None:
    values: dict[str, Any] = dict(slurm=separate_head_slurm(), launcher=RayLauncher(),
                                  ray_head_only=True, num_nodes=1,
                                  worker_allocation=SlurmWorkerAllocationConfig(partition="gpu"))
    values.update(kwargs)
    with pytest.raises(ValueError) as raised:
        SlurmSessionResource(**values)
    assert expected in str(raised.value)


def test_a_worker_allocation_needs_a_ray_launcher() -> None:
    with pytest.raises(ValueError, match="launcher='BashLauncher': worker_allocation needs"):
        SlurmSessionResource(slurm=separate_head_slurm(),
                             worker_allocation=SlurmWorkerAllocationConfig())


# -- the head's request and script ---------------------------------------------------------------
def test_the_head_asks_for_its_own_shape_and_only_the_queue_accounting() -> None:
    try:
        session = separate_head_compute().get_run_allocation_session(_context(), start=False)
        spec = session.spec
        assert (spec.partition, spec.time_limit, spec.num_nodes) == ("cpu", "00:10:00", 1)
        assert spec.cpus_per_task == 2 and spec.mem == "1500M" and spec.mem_per_cpu is None
        assert spec.gres is None and not spec.gpus_per_node
        assert (spec.account, spec.qos, spec.reservation) == ("proj", "high", "maint")
        assert spec.time_min is None and spec.signal is None
        assert "--constraint=a100" not in spec.extra_directives
        assert session.config is HEAD or session.config == HEAD
        assert session.drain_signal == "TERM"  # not the queue's USR1
        first = session.layout.first_worker
        assert (first.partition, first.gpus_per_node, first.time_limit) == ("gpu", 1, "01:30:00")
        assert (first.num_nodes, first.cpus_per_task, first.mem) == (2, 8, "64G")  # the queue's
        assert first.account == "proj"
    finally:
        sessions_of_run(RUN_ID)


def test_the_head_defaults_to_eight_gigabytes() -> None:
    compute = separate_head_compute(
        ray_head_allocation=SlurmRunAllocationConfig(partition="cpu", time_limit="60"))
    try:
        spec = compute.get_run_allocation_session(_context(), start=False).spec
        assert (spec.mem, spec.cpus_per_task, spec.num_nodes) == ("8G", 2, 1)
    finally:
        sessions_of_run(RUN_ID)


def test_the_head_script_offers_no_cpus_and_no_gpus_to_ray() -> None:
    session, cluster = layout_session(separate_head_layout())
    assert session.launcher.num_gpus_per_node == 2  # the run's launcher is kept as it is
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 1, lambda: cluster.start(job.job_id, ray_address="10.0.0.1:6379"))
    acquire_head(session.context, _Lines())
    (script,) = [text for path, text in cluster.files.items() if path.endswith("/allocation.sh")]
    assert "\n__ds_ray_num_cpus=0\n" in script and "\n__ds_ray_num_gpus=0\n" in script
    (spec,) = cluster.specs
    assert spec.partition == "cpu" and spec.num_nodes == 1


def test_without_a_layout_the_head_script_offers_the_launcher_values() -> None:
    session, cluster = layout_session(None, config=SlurmRunAllocationConfig())
    assert session.head_launcher is session.launcher
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    acquire_head(session.context, _Lines())
    (script,) = [text for path, text in cluster.files.items() if path.endswith("/allocation.sh")]
    assert "\n__ds_ray_num_cpus=''\n" in script and "\n__ds_ray_num_gpus=2\n" in script


def test_a_head_that_keeps_its_cpus_renders_the_launcher_as_it_is() -> None:
    resource = SlurmSessionResource(slurm=separate_head_slurm(),
                                    launcher=RayLauncher(num_cpus_per_node=4),
                                    worker_allocation=SlurmWorkerAllocationConfig())
    layout = resource.run_layout()
    assert layout is not None and not layout.head_only
    assert layout.head_launcher(resource.launcher) is resource.launcher


def test_ray_head_only_on_the_session_resource_keeps_the_run_allocation_request() -> None:
    resource = SlurmSessionResource(
        slurm=separate_head_slurm(), launcher=RayLauncher(), ray_head_only=True, num_nodes=1,
        run_allocation=SlurmRunAllocationConfig(partition="cpu", gpus_per_node=0),
        worker_allocation=SlurmWorkerAllocationConfig(partition="gpu", ray_resources={"a": 1}))
    try:
        session = resource.get_session(_context())
        assert session.spec.partition == "cpu" and session.spec.num_nodes == 1
        assert session.spec.account == "proj" and session.spec.time_limit == "02:00:00"
        assert session.layout is not None and session.layout.head_only
        copy = session.head_launcher
        assert (copy.num_cpus_per_node, copy.num_gpus_per_node) == (0, 0)  # type: ignore[attr-defined]
        first = session.layout.first_worker
        # unset fields from the head's request (its partition replaced, its num_nodes kept)
        assert (first.partition, first.num_nodes, first.gpus_per_node) == ("gpu", 1, 0)
        assert first.ray_resources == {"a": 1.0}
    finally:
        sessions_of_run(RUN_ID)


# -- the digest ----------------------------------------------------------------------------------
def test_resources_with_other_heads_get_other_sessions() -> None:
    contexts = [_context(RUN_ID)]
    try:
        plain = ComputeResource(mode="slurm", slurm=separate_head_slurm(),
                                allocation_scope="run", default_launcher=RayLauncher(),
                                run_allocation=WORKERS)
        a = separate_head_compute().get_run_allocation_session(contexts[0], start=False)
        b = separate_head_compute(ray_head_allocation=SlurmRunAllocationConfig(
            partition="cpu", mem="2G", time_limit="00:10:00")).get_run_allocation_session(
            contexts[0], start=False)
        c = separate_head_compute(run_allocation=SlurmRunAllocationConfig(partition="cpu")
                                  ).get_run_allocation_session(contexts[0], start=False)
        d = plain.get_run_allocation_session(contexts[0], start=False)
        assert len({a.digest, b.digest, c.digest, d.digest}) == 4
        assert len({a.job_name, b.job_name, c.job_name, d.job_name}) == 4
        assert separate_head_compute().get_run_allocation_session(contexts[0], start=False) is a
    finally:
        sessions_of_run(RUN_ID)


def test_a_session_without_a_layout_keeps_its_digest() -> None:
    slurm = separate_head_slurm()
    config = SlurmRunAllocationConfig(partition="cpu")
    session = RunSession(slurm, RUN_ID, config, RayLauncher(), activation=lambda: None)
    from dagster_slurm.session.session import session_digest

    assert session.digest == session_digest(config.queue_for(slurm.queue), config, RayLauncher())
    assert session.layout is None


# -- keeping a worker ----------------------------------------------------------------------------
class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    warning = error = info


def test_a_head_without_a_live_worker_submits_the_first_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    session, cluster, submitter = ready_head()
    monkeypatch.setattr(workers_keep, "submit_worker_allocation", submitter)
    allocation = session.ensure()
    assert allocation.job_id == "100"
    assert submitter.calls == [session.layout.first_worker]  # type: ignore[union-attr]
    assert "leases" not in cluster.doc() or WORKER_LEASE not in cluster.doc()["leases"]
    session.ensure()  # cached: the worker is checked once per process and head allocation
    assert len(submitter.calls) == 1


def test_a_live_worker_is_enough_and_a_dead_one_is_replaced() -> None:
    session, cluster, submitter = ready_head()
    acquire_head(session.context, _Lines())
    assert keep_a_worker(session.context, submit=submitter) is True
    assert keep_a_worker(session.context, submit=submitter) is False  # pending counts as live
    (worker,) = [j for j in cluster.jobs.values() if j.job_id != "100"]
    cluster.start(worker.job_id, nodes=("g1",))
    assert keep_a_worker(session.context, submit=submitter) is False
    cluster.end(worker.job_id, JobState.TIMEOUT)  # e.g. a retried run, the workers gone
    lines = _Lines()
    assert keep_a_worker(session.context, lines, submit=submitter) is True
    assert len(submitter.calls) == 2
    assert any("no live worker allocation: submitting one (partition gpu, 2 node(s)" in line
               for line in lines.lines), lines.lines


def test_an_uncertain_scheduler_or_a_closed_session_submits_nothing() -> None:
    session, cluster, submitter = ready_head()
    acquire_head(session.context, _Lines())
    cluster.queue_answers = False
    assert keep_a_worker(session.context, submit=submitter) is False
    cluster.queue_answers = True
    closed = tr.close_session(None, reason="teardown")
    assert isinstance(closed, tr.Change) and cluster.apply(closed).ok
    assert keep_a_worker(session.context, submit=submitter) is False
    assert submitter.calls == []


def test_a_scheduler_error_is_logged_and_submits_nothing() -> None:
    session, cluster, submitter = ready_head()
    acquire_head(session.context, _Lines())

    def broken(job_names: Any) -> Any:
        raise SchedulerError("squeue: connection refused")

    cluster.queue = broken  # type: ignore[method-assign]
    lines = _Lines()
    assert keep_a_worker(session.context, lines, submit=submitter) is False
    assert submitter.calls == []
    assert any("connection refused" in line and "none submitted" in line for line in lines.lines)


def test_another_process_holding_the_lease_submits_instead() -> None:
    session, cluster, submitter = ready_head()
    acquire_head(session.context, _Lines())
    assert lease.acquire(cluster.store, WORKER_LEASE, "other:1:ab", 120.0).acquired
    lines = _Lines()
    assert keep_a_worker(session.context, lines, submit=submitter) is False
    assert submitter.calls == [] and any("other:1:ab" in line for line in lines.lines)
    cluster.clock.sleep(121)  # the holder died: its lease expires
    assert keep_a_worker(session.context, submit=submitter) is True


def test_a_submission_that_another_process_made_meanwhile_is_seen_under_the_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    session, cluster, submitter = ready_head()
    acquire_head(session.context, _Lines())
    other = WorkerSubmitter(cluster)
    original = lease.acquire

    def acquire_after_the_other(*args: Any, **kwargs: Any) -> Any:
        # between this process's first look and its lease, another one submitted
        assert original(cluster.store, WORKER_LEASE, "other:2:cd", 120.0).acquired
        other(session, session.layout.first_worker, None)  # type: ignore[union-attr]
        assert lease.release(cluster.store, WORKER_LEASE, "other:2:cd")
        return original(*args, **kwargs)

    monkeypatch.setattr(lease, "acquire", acquire_after_the_other)
    assert keep_a_worker(session.context, submit=submitter) is False
    assert submitter.calls == [] and len(other.calls) == 1


def test_a_refused_submission_fails_the_step_and_the_next_one_checks_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    session, cluster, submitter = ready_head()
    calls: list[int] = []

    def refused(session: Any, config: Any, logger: Any, fence: Any = None) -> None:
        calls.append(1)
        raise SchedulerError("sbatch: error: invalid partition name")

    monkeypatch.setattr(workers_keep, "submit_worker_allocation", refused)
    with pytest.raises(SchedulerError, match="invalid partition"):
        session.ensure()
    assert session.current_allocation() is None  # not cached: the next step attaches and checks
    monkeypatch.setattr(workers_keep, "submit_worker_allocation", submitter)
    assert session.ensure().job_id == "100"
    assert len(cluster.specs) == 1  # the head was attached to, not submitted again
    assert len(calls) == 1 and len(submitter.calls) == 1
    assert WORKER_LEASE not in (cluster.doc().get("leases") or {})


def test_a_session_without_a_layout_never_submits_a_worker() -> None:
    session, cluster = layout_session(None, config=SlurmRunAllocationConfig())
    submitter = WorkerSubmitter(cluster)
    assert keep_a_worker(session.context, submit=submitter) is False
    assert submitter.calls == []


def test_the_head_watch_of_a_separate_head_submits_a_worker_when_none_is_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster_slurm.session.supervision.head_watch import HeadWatch, WatchAction
    from dagster_slurm.state.election import HEAD_CHECK_INTERVAL

    session, cluster, submitter = ready_head()
    monkeypatch.setattr(workers_keep, "submit_worker_allocation", submitter)
    session.ensure()
    assert session.separate_head and len(submitter.calls) == 1
    watch = HeadWatch(session.context)
    assert watch.interval == HEAD_CHECK_INTERVAL  # a separate head is watched from the start
    assert watch.check_once().action is WatchAction.KEEP
    assert len(submitter.calls) == 1  # the worker submitted by ensure() is pending: live
    (worker,) = [j for j in cluster.jobs.values() if j.job_id != "100"]
    cluster.end(worker.job_id, JobState.CANCELLED)
    squeues = cluster.calls.get("squeue", 0)
    assert watch.check_once().action is WatchAction.KEEP
    assert len(submitter.calls) == 2
    # the watch's own read is the first look; one more squeue under the lease
    assert cluster.calls["squeue"] - squeues == 2


def test_a_successor_of_a_separate_head_is_shaped_and_started_like_the_head() -> None:
    session, cluster, _submitter = ready_head()
    acquire_head(session.context, _Lines())
    successor = session.submit_successor(SlurmRunAllocationConfig(time_limit="00:20:00"))
    spec = cluster.specs[-1]
    assert (spec.partition, spec.time_limit, spec.num_nodes) == ("cpu", "00:20:00", 1)
    assert spec.cpus_per_task == 2 and spec.mem == "1500M" and not spec.gpus_per_node
    assert spec.time_min is None and spec.signal is None and spec.account == "proj"
    cluster.run_without_ready(successor.job_id)
    cluster.on_write = lambda files: cluster.clock.at(
        cluster.clock.t + 2, lambda: cluster.start(successor.job_id, nodes=("c2",)))
    assert session.promote_successor().job_id == successor.job_id
    (script,) = [text for path, text in cluster.files.items() if "/promoted-" in path]
    assert "\n__ds_ray_num_cpus=0\n" in script and "\n__ds_ray_num_gpus=0\n" in script


def test_a_separate_head_survives_dagster_building_the_resource_again() -> None:
    import dagster as dg

    compute = separate_head_compute(mode="local", slurm=None)

    @dg.asset
    def uses(compute: ComputeResource) -> int:
        return 1 if compute.ray_head_allocation == HEAD else 0

    result = dg.materialize([uses], resources={"compute": compute})
    assert result.success and result.output_for_node("uses") == 1
