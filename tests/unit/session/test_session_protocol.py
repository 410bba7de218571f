"""The run-session protocol against an in-memory cluster and a fake clock (no real sleeps).

Acquire (submit or attach), the ready wait, retiring an ended allocation, settling a
vanished submitter, closing, and what a closed session refuses. Each test runs in a few
milliseconds: every wait goes through the injected ``sleep``.
"""

from __future__ import annotations

from typing import Any

import pytest
from session_fakes import FakeCluster, Lines

from dagster_slurm.jobs.errors import SlurmJobUnschedulable, SlurmSubmissionError
from dagster_slurm.jobs.pending import PendingPolicy
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.protocol import FAILED_RECORD_SECONDS, SUBMIT_GRACE_SECONDS
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.head.acquire import acquire_head
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr

RUN_ID = "5e0b7a34-90c1-4a6e-8f0e-1b2c3d4e5f61"


def _slurm() -> SlurmResource:
    return SlurmResource(
        ssh=SSHConnectionResource(host="login.invalid", user="u"),
        remote_base="/cluster/ds",
        queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G"),
    )


def _session(cluster: FakeCluster | None = None, **config: Any) -> tuple[RunSession, FakeCluster]:
    slurm = _slurm()
    probe = RunSession(slurm, RUN_ID, SlurmRunAllocationConfig(**config), BashLauncher(),
                       activation=lambda: None)
    cluster = cluster or FakeCluster(probe.initial_document())
    session = RunSession(
        slurm, RUN_ID, SlurmRunAllocationConfig(**config), BashLauncher(),
        activation=lambda: None, io=cluster, clock=cluster.clock.monotonic,
        sleep=cluster.clock.sleep,
        pending=PendingPolicy({"PartitionTimeLimit": "lower time_limit"}, grace=0.0), background=False
    )
    return session, cluster


def _start_when_submitted(cluster: FakeCluster, after: float = 3.0, **kw: Any) -> None:
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + after, lambda: cluster.start(job.job_id, **kw))


def test_first_process_submits_and_waits_until_the_allocation_accepts_steps() -> None:
    session, cluster = _session()
    _start_when_submitted(cluster, ray_address="10.0.0.1:6379", nodes=("c1", "c2"))
    out = Lines()
    allocation = acquire_head(session.context, out)
    assert allocation.slurm_job_id == allocation.job_id == "100"
    assert allocation.nodes == ("c1", "c2") and allocation.ray_address == "10.0.0.1:6379"
    assert cluster.calls["sbatch"] == 1
    doc = tr.document(cluster.doc())
    assert tr.head_state(doc) is tr.HeadState.READY
    assert doc is not None and doc.allocation is not None and doc.allocation.nodes == ["c1", "c2"]
    assert "Submitted run allocation 100" in out.text()
    assert "Run allocation 100 accepts steps" in out.text()
    assert "waiting in the queue" in out.text()  # the pending reason was reported
    assert cluster.clock.slept < 10  # polled, not parked


def test_a_second_process_attaches_without_submitting() -> None:
    first, cluster = _session()
    _start_when_submitted(cluster)
    job_id = acquire_head(first.context, Lines()).job_id  # type: ignore[arg-type]
    second, _ = _session(cluster)
    out = Lines()
    assert acquire_head(second.context, out).job_id == job_id  # type: ignore[arg-type]
    assert cluster.calls["sbatch"] == 1
    assert "found; attaching to it" in out.text()


def test_a_loser_of_the_submission_race_waits_for_the_winners_job_id() -> None:
    session, cluster = _session()
    other, _ = _session(cluster)
    # another process holds a fresh 'submitting' record
    winner = tr.submit_head(None, token="tok-winner", config={})
    assert isinstance(winner, tr.Change)
    cluster.store.transact(winner.patch)

    def winner_gets_its_id() -> None:
        done = tr.head_submitted(None, token="tok-winner", job_id="42")
        assert isinstance(done, tr.Change)
        cluster.store.transact(done.patch)
        from session_fakes import FakeJob

        cluster.jobs["42"] = FakeJob("42", session.job_name, "tok-winner")
        cluster.start("42")

    cluster.clock.at(1.0, winner_gets_its_id)
    assert acquire_head(session.context, Lines()).job_id == "42"  # type: ignore[arg-type]
    assert cluster.calls.get("sbatch", 0) == 0


def test_a_vanished_submitter_is_settled_by_its_token_in_the_queue() -> None:
    session, cluster = _session()
    stale = tr.submit_head(None, token="tok-lost", config={})
    assert isinstance(stale, tr.Change)
    cluster.store.transact(stale.patch)
    from session_fakes import FakeJob

    cluster.jobs["77"] = FakeJob("77", session.job_name, "tok-lost")
    cluster.start("77")
    out = Lines()
    assert acquire_head(session.context, out).job_id == "77"  # type: ignore[arg-type]
    assert cluster.clock.t >= SUBMIT_GRACE_SECONDS  # waited out the grace, by the fake clock
    assert "Recovered run allocation 77" in out.text()
    assert cluster.calls.get("sbatch", 0) == 0


def test_a_vanished_submitter_without_a_job_is_retired_and_a_new_one_submitted() -> None:
    session, cluster = _session()
    stale = tr.submit_head(None, token="tok-gone", config={})
    assert isinstance(stale, tr.Change)
    cluster.store.transact(stale.patch)
    _start_when_submitted(cluster)
    allocation = acquire_head(session.context, Lines())
    doc = cluster.doc()
    assert doc["history"]["tok-gone"]["final_state"] == "unknown"
    assert doc["allocation"]["job_id"] == allocation.job_id
    assert cluster.calls["sbatch"] == 1


def test_an_allocation_that_ended_after_serving_steps_is_retired_and_replaced() -> None:
    session, cluster = _session()
    _start_when_submitted(cluster)
    first = acquire_head(session.context, Lines())
    cluster.end(first.job_id, JobState.TIMEOUT)
    again, _ = _session(cluster)
    out = Lines()
    second = acquire_head(again.context, out)
    assert second.job_id != first.job_id
    doc = cluster.doc()
    assert doc["history"][first.job_id]["final_state"] == "TIMEOUT"
    assert doc["history"][first.job_id]["ended_at"] is not None
    assert f"Run allocation {first.job_id} has ended (TIMEOUT)" in out.text()


def test_an_allocation_that_ends_before_accepting_steps_fails_with_its_log() -> None:
    session, cluster = _session()

    def dies(job: Any) -> None:
        cluster.files[session.paths.output_of(job.job_id)] = "slurmstepd: error: boom\n"
        cluster.clock.at(2.0, lambda: cluster.end(job.job_id, JobState.FAILED))

    cluster.on_submit = dies
    with pytest.raises(SessionError, match="ended \\(FAILED\\) before it accepted steps") as err:
        acquire_head(session.context, Lines())
    assert "slurmstepd: error: boom" in str(err.value)
    assert "100" in cluster.doc()["history"]  # retired, not resubmitted in a loop
    assert cluster.calls["sbatch"] == 1


def test_an_allocation_that_never_gets_ready_fails_after_startup_timeout_and_is_cancelled() -> None:
    session, cluster = _session(startup_timeout=30)
    cluster.on_submit = lambda job: cluster.run_without_ready(job.job_id)
    with pytest.raises(SessionError, match="did not accept steps within 30 s"):
        acquire_head(session.context, Lines())
    assert cluster.cancelled == ["100"]
    assert 30 <= cluster.clock.t < 40


def test_an_unschedulable_allocation_is_cancelled_and_retired() -> None:
    session, cluster = _session()

    def unschedulable(job: Any) -> None:
        job.reason = "PartitionTimeLimit"

    cluster.on_submit = unschedulable
    with pytest.raises(SlurmJobUnschedulable, match="lower time_limit"):
        acquire_head(session.context, Lines())
    assert cluster.cancelled == ["100"]
    assert cluster.doc()["history"]["100"]["final_state"] == "CANCELLED"
    assert cluster.doc().get("allocation") is None


def test_a_refused_submission_fails_steps_for_a_while_then_a_retry_submits() -> None:
    session, cluster = _session()
    cluster.sbatch_error = "invalid partition specified: nosuch"
    with pytest.raises(SlurmSubmissionError, match="invalid partition"):
        acquire_head(session.context, Lines())
    other, _ = _session(cluster)
    with pytest.raises(SlurmSubmissionError, match="could not be submitted \\(failed\\)"):
        acquire_head(other.context, Lines())
    cluster.clock.sleep(FAILED_RECORD_SECONDS + 1)
    cluster.sbatch_error = None
    _start_when_submitted(cluster)
    later, _ = _session(cluster)
    assert acquire_head(later.context, Lines()).job_id == "100"  # type: ignore[arg-type]
    assert cluster.calls["sbatch"] == 2  # the waiting process did not submit


def test_close_cancels_by_job_name_and_a_closed_session_submits_nothing() -> None:
    session, cluster = _session()
    _start_when_submitted(cluster)
    session.ensure()
    session.close(cancel=True, reason="the run is SUCCESS")
    assert cluster.cancelled == ["100"]
    doc = cluster.doc()
    assert doc["closed_reason"] == "the run is SUCCESS" and doc["closed_at"] is not None
    retry, _ = _session(cluster)
    with pytest.raises(SessionError, match="was closed \\(the run is SUCCESS\\)"):
        acquire_head(retry.context, Lines())
    assert cluster.calls["sbatch"] == 1


def test_close_without_use_cancels_but_writes_no_document() -> None:
    session, cluster = _session()
    session.close(cancel=True, reason="teardown")
    assert cluster.calls["scancel"] == 1
    assert cluster.store.snapshot().doc is None


def test_a_heartbeat_writes_the_document_and_the_file() -> None:
    session, cluster = _session()
    session.beat()
    doc = cluster.doc()
    assert doc["heartbeat"]["at"] == cluster.clock.wall()
    assert doc["heartbeat"]["pid"] > 0
    assert len(cluster.beats) == 1


def test_forget_retires_the_allocation_it_was_given() -> None:
    session, cluster = _session()
    _start_when_submitted(cluster)
    allocation = session.ensure()
    session.forget(allocation, "NODE_FAIL")
    assert cluster.doc()["history"][allocation.job_id]["final_state"] == "NODE_FAIL"
    assert session.current_allocation() is None
    assert cluster.cancelled == []  # Slurm ended it; nothing to cancel


def test_forget_cancels_an_allocation_slurm_put_back_in_the_queue() -> None:
    session, cluster = _session()
    _start_when_submitted(cluster)
    allocation = session.ensure()
    session.forget(allocation, "REQUEUED")
    assert cluster.cancelled == [allocation.job_id]
    assert cluster.doc()["history"][allocation.job_id]["final_state"] == "REQUEUED"
    assert session.current_allocation() is None


def test_the_ready_file_is_trusted_only_after_squeue_says_the_job_runs() -> None:
    session, cluster = _session()
    _start_when_submitted(cluster)
    allocation = acquire_head(session.context, Lines())
    # the ready file and the job ended; a later process must not attach to it
    cluster.end(allocation.job_id, JobState.COMPLETED)
    again, _ = _session(cluster)
    _start_when_submitted(cluster)
    assert acquire_head(again.context, Lines()).job_id != allocation.job_id  # type: ignore[arg-type]


def test_a_scheduler_that_does_not_answer_keeps_waiting_and_ends_nothing() -> None:
    session, cluster = _session()
    _start_when_submitted(cluster, after=1.0)
    cluster.queue_answers = False
    cluster.clock.at(60.0, lambda: setattr(cluster, "queue_answers", True))
    allocation = acquire_head(session.context, Lines())
    assert allocation.job_id == "100" and cluster.cancelled == []
    assert cluster.doc()["history"] == {}


def test_a_run_that_ends_while_the_allocation_waits_in_the_queue_cancels_it() -> None:
    from dagster_slurm.jobs.follow import DagsterRunEnded

    session, cluster = _session()
    asked: list[str] = []

    def follow(waiting_for: str) -> None:
        asked.append(waiting_for)
        if cluster.clock.t >= 20:
            raise DagsterRunEnded(RUN_ID, "FAILURE", waiting_for)

    session.context.follow = follow
    cluster.on_submit = lambda job: None  # stays pending
    with pytest.raises(DagsterRunEnded, match="FAILURE"):
        acquire_head(session.context, Lines())
    assert cluster.cancelled == ["100"]  # it was this process's submission
    assert 20 <= cluster.clock.t < 22
    assert asked[-1] == "run allocation 100"
