"""Removing and listing worker allocations against an in-memory cluster and a fake clock.

A job that has not started is cancelled; a running one gets its drain deadline persisted
before the drain file and the signal go out, keeps it on a repeated removal, is cancelled
once the deadline and the grace passed; a scheduler that does not answer never turns into
a cancel, a release or a COMPLETED; ``wait=False`` returns before following; the listing
holds live allocations only; teardown records every worker allocation as released.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from session_fakes import WALL_EPOCH, FakeCluster, FakeJob, Lines

from dagster_slurm.errors import ConfigurationError, SchedulerError
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.session import RunSession
from dagster_slurm.session.workers import removal as worker_removal
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt

RUN_ID = "5e0c11aa-2222-4b6e-9f0e-1b2c3d4e5f62"
WORKER_CONFIG = {"partition": "gpu", "num_nodes": 1, "cpus_per_task": 2, "gpus_per_node": 1,
                 "time_limit": "01:00:00", "mem": "1500M"}


def _session() -> tuple[RunSession, FakeCluster]:
    slurm = SlurmResource(ssh=SSHConnectionResource(host="login.invalid", user="u"),
                          remote_base="/cluster/ds",
                          queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="1500M"))
    config = SlurmRunAllocationConfig(time_limit="01:00:00")
    probe = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None)
    cluster = FakeCluster(probe.initial_document())
    session = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None,
                         io=cluster, clock=cluster.clock.monotonic,
                         sleep=cluster.clock.sleep, background=False)
    cluster.on_submit = lambda job: cluster.clock.at(cluster.clock.t + 1,
                                                     lambda: cluster.start(job.job_id))
    session.ensure()  # a running head, job 100
    cluster.on_submit = None
    return session, cluster


def _worker(session: RunSession, cluster: FakeCluster, state: JobState = JobState.RUNNING,
            nodes: tuple[str, ...] = ("g1",), joined: bool = True) -> str:
    """A worker allocation of the session: its job (the session's job name) and records."""
    job_id = str(cluster.next_id)
    cluster.next_id += 1
    token = f"wtok-{job_id}"
    cluster.jobs[job_id] = FakeJob(job_id, session.job_name, token, state=state,
                                   reason="Resources" if state is JobState.PENDING else None,
                                   nodes=nodes if state is JobState.RUNNING else ())
    steps = (lambda doc: wt.submit_worker(doc, token=token, config=WORKER_CONFIG, shape={}),
             lambda doc: wt.worker_submitted(doc, token=token, job_id=job_id))
    for step in steps:
        decided = step(cluster.read().doc)
        assert isinstance(decided, tr.Change) and cluster.store.transact(decided.patch).ok
    if joined and state is JobState.RUNNING:
        decided = wt.record_worker_joined(cluster.read().doc, job_id=job_id, nodes=list(nodes),
                                          ray_node_ids={n: f"ray-{n}" for n in nodes})
        assert isinstance(decided, tr.Change) and cluster.store.transact(decided.patch).ok
    return job_id


def _record(cluster: FakeCluster, job_id: str) -> dict[str, Any]:
    return cluster.doc()["workers"][job_id]


def _drain_ends_after(cluster: FakeCluster, seconds: float) -> None:
    """The batch script drains on USR1: the job completes ``seconds`` later."""
    def on_signal(job: FakeJob, signal: str) -> None:
        assert signal == "USR1"
        cluster.clock.at(cluster.clock.t + seconds, lambda: cluster.end(job.job_id))
    cluster.on_signal = on_signal


# -- not started: cancelled ----------------------------------------------------------------------
def test_a_pending_worker_allocation_is_cancelled_and_released() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster, JobState.PENDING)
    out = Lines()
    assert session.remove_worker_allocation(worker, logger=out) is JobState.CANCELLED
    assert cluster.cancelled == [worker] and cluster.signals == []
    record = _record(cluster, worker)
    assert record["released"] is True and record["final_state"] == "CANCELLED"
    assert record.get("drain_deadline") is None
    assert "had not started (PENDING, reason Resources): cancelled it" in out.text("info")
    assert cluster.jobs["100"].state is JobState.RUNNING  # the head is left alone


# -- running: drained -------------------------------------------------------------------------
def test_the_deadline_is_persisted_before_the_drain_file_and_the_signal() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster, nodes=("g1", "g2"))
    _drain_ends_after(cluster, 20)
    start = cluster.clock.wall()
    out = Lines()
    assert session.remove_worker_allocation(worker, drain_timeout=120,
                                            logger=out) is JobState.COMPLETED
    ((job_id, signal, doc_then),) = cluster.signals  # one signal, to the worker only
    assert (job_id, signal) == (worker, "USR1")
    deadline = doc_then["workers"][worker]["drain_deadline"]
    assert deadline == pytest.approx(start + 120, abs=1)
    drain_file = session.paths.worker_drain(worker)
    assert cluster.files[drain_file] == f"deadline={int(deadline)}\n"
    assert cluster.cancelled == []  # it left by itself before the deadline
    record = _record(cluster, worker)
    assert record["released"] is True and record["final_state"] == "COMPLETED"
    assert record["drain_deadline"] == deadline
    text = out.text("info")
    assert "Draining worker allocation" in text and "g1, g2" in text
    assert "deadline in" in text and "ended COMPLETED" in text


def test_a_repeated_removal_keeps_the_persisted_deadline() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    first = wt.request_worker_drain(cluster.read().doc, job_id=worker, drain_timeout=600)
    assert isinstance(first, tr.Change) and cluster.store.transact(first.patch).ok
    deadline = _record(cluster, worker)["drain_deadline"]
    cluster.clock.sleep(100)  # the process that asked died; another one removes it again
    _drain_ends_after(cluster, 5)
    out = Lines()
    assert session.remove_worker_allocation(worker, drain_timeout=10,
                                            logger=out) is JobState.COMPLETED
    assert cluster.signals[0][2]["workers"][worker]["drain_deadline"] == deadline
    assert cluster.files[session.paths.worker_drain(worker)] == f"deadline={int(deadline)}\n"
    assert _record(cluster, worker)["drain_deadline"] == deadline
    assert "drains already" in out.text("info")
    # once released, another removal changes nothing and says so
    assert session.remove_worker_allocation(worker, logger=out) is JobState.COMPLETED
    assert len(cluster.signals) == 1 and "released from the session already" in out.text()


def test_a_worker_still_running_after_the_deadline_and_the_grace_is_cancelled() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    start = cluster.clock.t
    early: list[bool] = []
    cluster.clock.at(start + 60 + worker_removal.DRAIN_GRACE - 2,
                     lambda: early.append(worker in cluster.cancelled))
    out = Lines()
    assert session.remove_worker_allocation(worker, drain_timeout=60,
                                            logger=out) is JobState.CANCELLED
    assert early == [False]  # not before the deadline and the grace
    assert cluster.cancelled == [worker]
    assert "after its drain deadline (RUNNING); cancelling it" in out.text("warning")
    assert _record(cluster, worker)["final_state"] == "CANCELLED"


def test_a_scheduler_that_stops_answering_never_turns_into_a_cancel_or_completed() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    cluster.on_signal = lambda job, signal: setattr(cluster, "queue_answers", False)
    out = Lines()
    with pytest.raises(SchedulerError, match="nothing was cancelled or released"):
        session.remove_worker_allocation(worker, drain_timeout=10, logger=out)
    assert cluster.cancelled == []
    record = _record(cluster, worker)
    assert record["released"] is False and record["drain_deadline"] is not None
    assert "does not answer" in out.text("warning")
    assert cluster.clock.t >= worker_removal.UNANSWERED_LIMIT


def test_a_scheduler_that_does_not_answer_at_first_is_waited_for() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    cluster.queue_answers = False
    cluster.clock.at(cluster.clock.t + 40, lambda: setattr(cluster, "queue_answers", True))
    _drain_ends_after(cluster, 3)
    out = Lines()
    assert session.remove_worker_allocation(worker, logger=out) is JobState.COMPLETED
    assert cluster.signals[0][2]["workers"][worker]["drain_deadline"] is not None
    assert "does not answer" in out.text("warning") and cluster.cancelled == []


def test_a_scheduler_that_never_answers_raises_before_anything_is_sent() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    cluster.queue_answers = False
    with pytest.raises(SchedulerError):
        session.remove_worker_allocation(worker)
    assert cluster.signals == [] and cluster.cancelled == []
    assert _record(cluster, worker).get("drain_deadline") is None


def test_an_ended_job_without_accounting_is_released_with_the_state_squeue_showed() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    cluster.end(worker, JobState.TIMEOUT)
    cluster.accounting_answers = False
    assert session.remove_worker_allocation(worker) is JobState.TIMEOUT
    assert cluster.signals == [] and _record(cluster, worker)["final_state"] == "TIMEOUT"


def test_a_job_gone_from_squeue_and_sacct_is_released_as_unknown_never_completed() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    cluster.jobs.pop(worker)  # left the queue (certain squeue), sacct knows nothing
    out = Lines()
    assert session.remove_worker_allocation(worker, logger=out) is JobState.UNKNOWN
    assert "neither squeue nor sacct" in out.text("warning")
    assert _record(cluster, worker)["final_state"] == "UNKNOWN"


# -- wait=False ----------------------------------------------------------------------------------
def test_wait_false_returns_once_the_drain_is_requested_and_follows_in_a_thread() -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    gate = threading.Semaphore(0)
    sleepers: list[str] = []

    def sleep(seconds: float) -> None:
        sleepers.append(threading.current_thread().name)
        assert gate.acquire(timeout=10)
        cluster.clock.sleep(seconds)

    session.context.sleep = sleep
    assert session.remove_worker_allocation(worker, drain_timeout=300, wait=False) is None
    assert len(cluster.signals) == 1  # requested before the call returned
    assert not _record(cluster, worker)["released"]
    (thread,) = [t for t in threading.enumerate()
                 if t.name == f"dagster-slurm-worker-removal-{worker}"]
    assert thread.daemon
    cluster.end(worker)
    for _ in range(20):
        gate.release()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert threading.current_thread().name not in sleepers  # the caller never waited
    assert _record(cluster, worker)["final_state"] == "COMPLETED"


# -- argument checks -----------------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [-1, float("inf"), float("nan"), True, "60"])
def test_a_bad_drain_timeout_is_refused_naming_the_field(timeout: Any) -> None:
    session, cluster = _session()
    worker = _worker(session, cluster)
    with pytest.raises(ConfigurationError, match="drain_timeout"):
        session.remove_worker_allocation(worker, drain_timeout=timeout)
    assert cluster.signals == []


def test_an_unknown_worker_allocation_is_refused() -> None:
    session, _cluster = _session()
    with pytest.raises(SessionError, match="no worker allocation with job id '999'"):
        session.remove_worker_allocation("999")


# -- listing and teardown ------------------------------------------------------------------------
def test_worker_allocations_lists_the_live_ones_only() -> None:
    session, cluster = _session()
    first = _worker(session, cluster)
    pending = _worker(session, cluster, JobState.PENDING)
    gone = _worker(session, cluster)
    released = wt.release_worker(cluster.read().doc, job_id=gone, final_state="COMPLETED")
    assert isinstance(released, tr.Change) and cluster.store.transact(released.patch).ok
    handles = session.worker_allocations
    assert [h.job_id for h in handles] == [first, pending]
    assert handles[0].slurm_job_id == first and handles[0].token == f"wtok-{first}"
    assert handles[0].config.partition == "gpu" and handles[0].config.mem == "1500M"
    assert handles[1].state() is JobState.PENDING
    # a handle from the listing removes the allocation (a restarted supervisor)
    assert session.remove_worker_allocation(handles[1]) is JobState.CANCELLED
    assert [h.job_id for h in session.worker_allocations] == [first]


def test_teardown_cancels_the_worker_allocations_and_records_them_released() -> None:
    session, cluster = _session()
    workers = [_worker(session, cluster), _worker(session, cluster, JobState.PENDING)]
    session.close(cancel=True, reason="the run ended")
    assert set(cluster.cancelled) == {"100", *workers}  # scancel --name reaches them all
    doc = cluster.doc()
    assert doc["closed_at"] is not None
    assert all(doc["workers"][w]["released"] for w in workers)
    assert wt.live_workers(tr.document(doc)) == {}
    assert cluster.clock.wall() >= WALL_EPOCH
