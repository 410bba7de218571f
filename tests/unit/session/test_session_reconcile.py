"""inspect, reconcile_workers and assign_worker_intent on the in-memory cluster.

Each call's round trips are counted (``observe`` and ``act`` are one each); the decisions
themselves are property-tested in ``test_reconcile_plan.py``, the real thing runs on the dev
cluster in ``tests/integration/test_reconcile_workers.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from session_fakes import FakeCluster, on_fake_cluster

from dagster_slurm.errors import ConfigurationError, TransportError
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.scaling import reconcile
from dagster_slurm.session.scaling.intents import WorkerIntent
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import lease

RUN_ID = "7d1f0c2e-3333-4a6e-8f0e-1b2c3d4e5f61"
GPU = SlurmWorkerAllocationConfig(partition="gpu", gpus_per_node=1, time_limit="01:00:00")


def _session(launcher: Any = None) -> tuple[RunSession, FakeCluster]:
    slurm = SlurmResource(ssh=SSHConnectionResource(host="login.invalid", user="u"),
                          remote_base="/cluster/ds",
                          queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G"))
    config = SlurmRunAllocationConfig(time_limit="02:00:00")
    return on_fake_cluster(slurm, RUN_ID, config, launcher or RayLauncher(),
                           activation="/env/activate.sh")


def _trips(cluster: FakeCluster) -> int:
    return cluster.calls.get("observe", 0) + cluster.calls.get("act", 0)


def _reset(cluster: FakeCluster) -> None:
    cluster.calls.clear()


def _gpu(count: int, **kw: Any) -> WorkerIntent:
    return WorkerIntent(key="gpu", count=count, config=GPU, **kw)


# -- inspect ------------------------------------------------------------------------------------
def test_inspect_is_one_round_trip_and_unknown_is_none() -> None:
    session, cluster = _session()
    added = session.add_worker_allocation(GPU)
    job = cluster.jobs[added.job_id]
    _reset(cluster)
    snap = session.inspect()
    assert _trips(cluster) == 1 and cluster.calls["observe"] == 1
    (w,) = snap.workers()
    assert (w.slurm_job_id, w.state, w.reason, w.intent, w.submitted_at) == (
        added.job_id, "PENDING", "Priority", None, None)
    assert w.time_left_seconds is None and w.granted_gpus is None and w.ready is False
    assert w.committed is True and w.requested_gpus_per_node == 1 and snap.certain
    job.state, job.nodes, job.tres = JobState.RUNNING, ("g1",), "cpu=2,node=1,gres/gpu=1"
    cluster.files[session.paths.ray_nodes(added.job_id)] = "g1 node-a 5\n"
    (w,) = session.inspect().workers()
    assert (w.state, w.granted_gpus, w.nodes, w.time_left_seconds) == (
        "RUNNING", 1, ("g1",), 600.0)
    assert w.ray_nodes == {"g1": "node-a"} and w.ready is True  # no head file: any head
    cluster.queue_answers = False
    snap = session.inspect()
    (w,) = snap.workers()
    assert not snap.certain and w.state is None and w.committed is None
    assert w.granted_gpus is None and w.time_left_seconds is None


# -- reconcile ----------------------------------------------------------------------------------
def test_scale_out_then_in_two_round_trips_each_and_deadlines_before_drains() -> None:
    session, cluster = _session()
    _reset(cluster)
    result = session.reconcile_workers(_gpu(2))
    assert len(result.submitted) == 2 and result.live == result.submitted
    assert _trips(cluster) == 2 and not result.held_back
    doc = cluster.doc()
    for job_id in result.submitted:
        record = doc["workers"][job_id]
        assert record["intent"] == "gpu" and record["reconciled"] is True
        assert cluster.jobs[job_id].state is JobState.PENDING
    snap = session.inspect()
    assert [w.submitted_at is not None for w in snap.workers("gpu")] == [True, True]
    # nothing more when the count holds
    again = session.reconcile_workers(_gpu(2))
    assert again.submitted == () and set(again.live) == set(result.submitted)
    # scale in: one running, one pending -> the pending one goes first (cancelled)
    running, pending = result.submitted
    cluster.jobs[running].state, cluster.jobs[running].nodes = JobState.RUNNING, ("g1",)
    _reset(cluster)
    down = session.reconcile_workers(_gpu(1))
    assert down.released == (pending,) and down.cancelled == (pending,)
    assert cluster.jobs[pending].state is JobState.CANCELLED and _trips(cluster) == 2
    down = session.reconcile_workers(_gpu(0, drain_timeout=90))
    assert down.released == (running,) and down.ended == (pending,)
    (_, signal, doc_then) = cluster.signals[-1]
    assert signal == "USR1" and doc_then["workers"][running]["drain_deadline"] is not None
    deadline = doc_then["workers"][running]["drain_deadline"]
    assert cluster.files[session.paths.worker_drain(running)] == f"deadline={int(deadline)}\n"
    # a repeat keeps the deadline; the job ends: recorded released with its state
    assert session.reconcile_workers(_gpu(0, drain_timeout=5)).released == ()
    assert cluster.doc()["workers"][running]["drain_deadline"] == deadline
    cluster.end(running)
    ended = session.reconcile_workers(_gpu(0))
    assert ended.ended == (running,)
    assert cluster.doc()["workers"][running]["final_state"] == "COMPLETED"
    assert lease.current_holder(cluster.doc(), reconcile.RECONCILE_LEASE, 0) is None


def test_a_fresh_process_cancels_once_a_persisted_deadline_passed() -> None:
    session, cluster = _session()
    (job_id,) = session.reconcile_workers(_gpu(1)).submitted
    cluster.jobs[job_id].state = JobState.RUNNING
    cluster.files[session.paths.worker_state(job_id)] = "draining\n"
    session.reconcile_workers(_gpu(0, drain_timeout=60))
    # a new session object (a restarted supervisor) on the same document
    fresh = RunSession(session.slurm, RUN_ID, session.config, session.launcher,
                       activation=lambda: "/env/activate.sh", io=cluster,
                       clock=cluster.clock.monotonic, sleep=cluster.clock.sleep, background=False)
    early = fresh.reconcile_workers(_gpu(0))
    assert early.cancelled == () and cluster.jobs[job_id].state is JobState.RUNNING
    cluster.clock.sleep(60 + 30)
    late = fresh.reconcile_workers(_gpu(0))
    assert late.cancelled == (job_id,) and cluster.jobs[job_id].state is JobState.CANCELLED


def test_an_unanswering_scheduler_gets_nothing_done_and_says_why() -> None:
    session, cluster = _session()
    (job_id,) = session.reconcile_workers(_gpu(1)).submitted
    cluster.queue_answers = False
    result = session.reconcile_workers(_gpu(3), release=[job_id])
    assert result.submitted == result.released == result.cancelled == ()
    assert "did not answer" in result.held_back[0] and result.live == (job_id,)
    cluster.queue_answers = True
    assert len(session.reconcile_workers(_gpu(3)).submitted) == 2


def test_an_interrupted_submission_is_recovered_by_its_token_and_not_repeated() -> None:
    session, cluster = _session()
    cluster.lose_submit_answer = True
    with pytest.raises(TransportError):
        session.reconcile_workers(_gpu(1))
    (job_id,) = cluster.jobs
    # the lease was given back (it does not block the next call for its lifetime)
    assert lease.current_holder(cluster.doc(), reconcile.RECONCILE_LEASE,
                                cluster.clock.wall()) is None
    started = cluster.clock.t
    result = session.reconcile_workers(_gpu(1))
    assert cluster.clock.t == started
    assert result.recovered == (job_id,) and result.submitted == ()
    assert result.live == (job_id,)
    assert cluster.doc()["workers"][job_id]["intent"] == "gpu"
    assert len(cluster.jobs) == 1


def test_a_held_lease_is_waited_for_and_an_expired_one_taken_over() -> None:
    session, cluster = _session()
    store = cluster.store
    assert store.transact(lease.acquire_patch(reconcile.RECONCILE_LEASE, "other:1:x", 30,
                                              None)).ok
    started = cluster.clock.t
    result = session.reconcile_workers(_gpu(1))
    assert len(result.submitted) == 1 and cluster.clock.t - started >= 29
    assert lease.current_holder(cluster.doc(), reconcile.RECONCILE_LEASE,
                                cluster.clock.wall()) is None


def test_intentless_and_head_hosting_allocations_are_never_released() -> None:
    session, cluster = _session()
    added = session.add_worker_allocation(GPU)
    (mine,) = session.reconcile_workers(_gpu(1)).submitted
    result = session.reconcile_workers(_gpu(0))
    assert result.released == (mine,) and added.job_id not in result.released
    # an intent member elected as head: counts, never released
    session2, cluster2 = _session()
    (host,) = session2.reconcile_workers(_gpu(1)).submitted
    doc = cluster2.doc()
    cluster2.store.transact([{"op": "add", "path": "/allocation",
                              "value": {"kind": "worker", "job_id": host,
                                        "status": "submitted"}}])
    assert doc is not None
    result = session2.reconcile_workers(_gpu(0), release=[host])
    assert result.released == () and "hosts the run's Ray head" in result.held_back[0]


def test_assign_worker_intent_moves_allocations_in_and_out() -> None:
    session, cluster = _session()
    added = session.add_worker_allocation(GPU)
    session.assign_worker_intent(added.job_id, "gpu")
    result = session.reconcile_workers(_gpu(1, pending_timeout=1))
    assert result.submitted == () and result.live == (added.job_id,)
    cluster.clock.sleep(10)  # joined the intent: no submission time, never expires
    assert session.reconcile_workers(_gpu(1, pending_timeout=1)).cancelled == ()
    session.assign_worker_intent(added.job_id, None)
    assert len(session.reconcile_workers(_gpu(1)).submitted) == 1
    assert session.reconcile_workers(_gpu(0)).released != (added.job_id,)
    with pytest.raises(SessionError, match="no worker allocation"):
        session.assign_worker_intent("999", "gpu")
    with pytest.raises(ConfigurationError, match="key"):
        session.assign_worker_intent(added.job_id, "bad key")


def test_bad_input_is_refused_before_anything_runs() -> None:
    session, cluster = _session()
    with pytest.raises(ConfigurationError, match="count"):
        WorkerIntent(key="gpu", count=-1)
    with pytest.raises(ConfigurationError, match="pending_timeout"):
        WorkerIntent(key="gpu", count=1, pending_timeout=-5)
    with pytest.raises(ConfigurationError, match="release"):
        session.reconcile_workers(_gpu(1), release=["abc"])
    with pytest.raises(ConfigurationError, match="max_submissions"):
        session.reconcile_workers(_gpu(1), max_submissions=-1)
    bash, bash_cluster = _session(BashLauncher())
    with pytest.raises(SessionError, match="RayLauncher"):
        bash.reconcile_workers(_gpu(1))
    assert _trips(cluster) == 0 and _trips(bash_cluster) == 0


def test_the_session_resource_passes_the_contexts_session_on(monkeypatch: pytest.MonkeyPatch):
    from dagster_slurm.session.frontend.resource import SlurmSessionResource

    session, cluster = _session()
    resource = SlurmSessionResource(slurm=session.slurm, launcher=RayLauncher())
    monkeypatch.setattr(SlurmSessionResource, "get_session", lambda self, context: session)
    context = object()
    (job_id,) = resource.reconcile_workers(context, _gpu(1)).submitted
    assert [w.slurm_job_id for w in resource.inspect(context).workers("gpu")] == [job_id]
    resource.assign_worker_intent(context, job_id, None)
    assert resource.inspect(context).workers("gpu") == ()


def test_a_submission_refused_for_a_limit_is_held_back_not_failed() -> None:
    session, cluster = _session()
    cluster.sbatch_error = ("sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job "
                            "submission failed: Job violates accounting/QOS policy (job submit "
                            "limit, user's size and/or time limits)")
    result = session.reconcile_workers(_gpu(1))
    assert result.submitted == ()
    (held,) = result.held_back
    assert "waits for a free slot" in held and "MaxSubmitJobs" in held
    assert not held.startswith("a submission failed")
    cluster.sbatch_error = None  # a job of the user ended: the next call submits it
    assert len(session.reconcile_workers(_gpu(1)).submitted) == 1
