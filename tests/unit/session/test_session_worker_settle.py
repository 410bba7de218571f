"""Open worker submissions whose submitter vanished are settled by their token (in-memory
cluster): a job carrying the token becomes the worker record and nothing new is submitted;
no such job in a certain squeue marks the submission failed and the first worker is
submitted again; a fresh open submission, or an uncertain squeue, settles nothing."""

from __future__ import annotations

from separate_heads import ready_head
from session_fakes import FakeCluster, FakeJob, Lines

from dagster_slurm.session.head.acquire import acquire_head
from dagster_slurm.session.workers.keep import keep_a_worker
from dagster_slurm.session.workers.settle import SUBMIT_GRACE_SECONDS, stale_tokens
from dagster_slurm.slurm.states import JobState


def _open_submission(cluster: FakeCluster, token: str) -> None:
    """What a submitter that died between recording the token and sbatch leaves."""
    assert cluster.store.transact([
        {"op": "add", "path": f"/worker_submissions/{token}",
         "value": {"token": token, "status": "submitting", "kind": "worker"}},
        {"op": "add", "path": f"/worker_submissions/{token}/submitted_at", "value_now": 0},
    ]).ok


def test_a_stale_submission_whose_job_exists_becomes_the_worker() -> None:
    session, cluster, submitter = ready_head()
    acquire_head(session.context, Lines())
    _open_submission(cluster, "tok-dead")
    cluster.jobs["555"] = FakeJob("555", session.job_name, "tok-dead", JobState.RUNNING,
                                  None, ("g1",))
    assert keep_a_worker(session.context, submit=submitter) is False  # fresh: in flight
    assert cluster.doc()["worker_submissions"]["tok-dead"]["status"] == "submitting"
    cluster.clock.sleep(SUBMIT_GRACE_SECONDS + 1)
    assert keep_a_worker(session.context, submit=submitter) is False  # found: a live worker
    doc = cluster.doc()
    assert doc["worker_submissions"]["tok-dead"]["status"] == "submitted"
    assert "555" in doc["workers"] and submitter.calls == []


def test_a_stale_submission_without_a_job_is_failed_and_a_worker_submitted_again() -> None:
    session, cluster, submitter = ready_head()
    acquire_head(session.context, Lines())
    _open_submission(cluster, "tok-lost")
    cluster.clock.sleep(SUBMIT_GRACE_SECONDS + 1)
    cluster.queue_answers = False
    assert keep_a_worker(session.context, submit=submitter) is False  # uncertain: nothing settled
    assert cluster.doc()["worker_submissions"]["tok-lost"]["status"] == "submitting"
    cluster.queue_answers = True
    assert keep_a_worker(session.context, submit=submitter) is True
    assert cluster.doc()["worker_submissions"]["tok-lost"]["status"] == "failed"
    assert len(submitter.calls) == 1


def test_stale_tokens_only_lists_open_submissions_past_the_grace() -> None:
    session, cluster, _submitter = ready_head()
    _open_submission(cluster, "a")
    read = cluster.read()
    assert stale_tokens(read.doc, read.now) == []
    assert stale_tokens(read.doc, read.now + SUBMIT_GRACE_SECONDS) == ["a"]
    assert stale_tokens(None, read.now) == []
