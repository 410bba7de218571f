"""replace_head against an in-memory cluster and a fake clock (no real sleeps, no threads
renewing: the claim keeper's first renewal is half a lease of real time away).

A healthy head is returned unchanged and no claim is written; a lost head is replaced by
the running published successor, by a queued successor once it runs, or by a new
allocation; a claim held by another elector is waited for and taken over once its lease
passed; an uncertain scheduler never elects; a failed election releases its claim.
"""

from __future__ import annotations

from typing import Any

import pytest
from running_heads import new_session, ray_running_head, running_head, start_on_promotion
from session_fakes import FakeCluster

from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.head.acquire import submit_head
from dagster_slurm.session.head.election import ClaimKeeper, HeadElectionTimeout
from dagster_slurm.session.supervision.head_watch import HeadWatch, WatchAction, decide
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import election_transitions as et
from dagster_slurm.state.election import (
    HANDOVER_LEAD,
    HEAD_CHECK_INTERVAL,
    WORKER_DISCOVERY_INTERVAL,
)


def _start_new_heads(cluster: FakeCluster) -> None:
    """Every later submission starts 3 s after sbatch answered."""
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 3, lambda: cluster.start(job.job_id, nodes=("c2",)))


def test_a_healthy_head_is_returned_unchanged_and_nothing_is_claimed() -> None:
    session, cluster, head = running_head()
    assert session.replace_head(timeout=10).job_id == head
    assert cluster.doc().get("election") is None
    assert cluster.calls.get("sbatch") == 1


def test_a_lost_head_is_replaced_by_the_running_published_successor() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor(SlurmRunAllocationConfig())
    cluster.start(successor.job_id, nodes=("c2",))
    cluster.end(head, JobState.CANCELLED)
    start_on_promotion(cluster, successor.job_id)
    allocation = session.replace_head(timeout=60)
    assert allocation.job_id == successor.job_id
    doc = cluster.doc()
    assert doc["allocation"]["job_id"] == successor.job_id
    assert doc["election"]["term"] == 1 and doc["election"]["claimed_by"] is None
    assert doc["election"]["candidate"] == successor.job_id


def test_a_lost_head_without_successor_gets_a_new_allocation_shaped_like_it() -> None:
    session, cluster, head = running_head()
    cluster.end(head, JobState.NODE_FAIL)
    _start_new_heads(cluster)
    allocation = session.replace_head(timeout=60)
    assert allocation.job_id != head and cluster.calls["sbatch"] == 2
    assert cluster.specs[-1].partition == cluster.specs[0].partition
    assert cluster.specs[-1].time_limit == cluster.specs[0].time_limit
    doc = cluster.doc()
    assert doc["allocation"]["job_id"] == allocation.job_id
    assert any(r.get("job_id") == head for r in doc["history"].values())
    assert doc["election"]["claimed_by"] is None and doc["election"]["candidate"] is None
    # a second call (another process that waited) gets the same head, nothing new
    assert session.replace_head(timeout=10).job_id == allocation.job_id
    assert cluster.calls["sbatch"] == 2


def test_a_queued_successor_is_promoted_once_it_runs_instead_of_a_new_allocation() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor(SlurmRunAllocationConfig())
    cluster.end(head, JobState.TIMEOUT)
    cluster.clock.at(cluster.clock.t + 20, lambda: cluster.start(successor.job_id, nodes=("c2",)))
    start_on_promotion(cluster, successor.job_id)
    allocation = session.replace_head(timeout=600)
    assert allocation.job_id == successor.job_id
    assert cluster.calls["sbatch"] == 2  # the head and the successor, nothing more


def test_an_unexpired_claim_of_another_elector_is_waited_out_then_taken_over() -> None:
    session, cluster, head = running_head()
    cluster.end(head, JobState.CANCELLED)
    read = cluster.read()
    claim = et.claim_election(read.doc, owner="other:1:dead", candidate=None, now=read.now)
    assert isinstance(claim, et.Change) and cluster.apply(claim).ok
    started = cluster.clock.t
    _start_new_heads(cluster)
    allocation = session.replace_head(timeout=600)
    waited = cluster.clock.t - started
    assert et.CLAIM_TTL <= waited <= et.CLAIM_TTL + 30  # blocked for at most the lease
    assert allocation.job_id != head
    assert cluster.doc()["election"]["term"] == 2


def test_an_uncertain_scheduler_never_elects_and_the_timeout_says_so() -> None:
    session, cluster, head = running_head()
    cluster.end(head, JobState.CANCELLED)
    cluster.queue_answers = False
    with pytest.raises(HeadElectionTimeout, match="uncertain"):
        session.replace_head(timeout=30)
    assert cluster.calls["sbatch"] == 1 and cluster.doc().get("election") is None


def test_a_failed_election_releases_its_claim_and_the_error_propagates() -> None:
    session, cluster, head = running_head()
    cluster.end(head, JobState.CANCELLED)
    cluster.sbatch_error = "Invalid partition name specified"
    with pytest.raises(Exception, match="Invalid partition"):
        session.replace_head(timeout=60)
    election = cluster.doc()["election"]
    assert election["claimed_by"] is None  # the next caller elects at once


def test_the_claim_keeper_renews_and_notices_a_takeover() -> None:
    session, cluster, head = running_head()
    cluster.end(head, JobState.CANCELLED)
    read = cluster.read()
    claim = et.claim_election(read.doc, owner="me", candidate=None, now=read.now)
    assert isinstance(claim, et.Change) and cluster.apply(claim).ok
    keeper = ClaimKeeper(session, "me", 1)
    before = cluster.doc()["election"]["expires_at"]
    cluster.clock.sleep(50)
    assert keeper.renew_once() and cluster.doc()["election"]["expires_at"] > before
    cluster.clock.sleep(et.CLAIM_TTL + 1)
    read = cluster.read()
    takeover = et.claim_election(read.doc, owner="other", candidate=None, now=read.now)
    assert isinstance(takeover, et.Change) and cluster.apply(takeover).ok
    assert not keeper.renew_once() and keeper.lost


def test_a_closed_session_elects_nothing() -> None:
    session, cluster = new_session()
    session.ensure  # noqa: B018 - the session exists but never submitted
    session.close(cancel=True)
    with pytest.raises(Exception, match="closed"):
        session.replace_head(timeout=5)


# -- the step processes' head check ----------------------------------------------------------
def _add_worker_record(cluster: FakeCluster, job_id: str = "900") -> None:
    """A live worker allocation in the document (as add_worker_allocation records it)."""
    assert cluster.store.transact([
        {"op": "add", "path": f"/workers/{job_id}",
         "value": {"job_id": job_id, "nodes": ["g1"], "config": {}}},
    ]).ok


def _view(cluster: FakeCluster, session: Any) -> tuple[Any, Any, float]:
    from dagster_slurm.session.head.election import scheduler_view

    return scheduler_view(session)


def test_decide_is_idle_without_workers_and_keeps_a_healthy_head() -> None:
    session, cluster, head = running_head()
    doc, view, now = _view(cluster, session)
    assert decide(doc, view, now, separate_head=False, has_signal=True).action is WatchAction.IDLE
    _add_worker_record(cluster)
    doc, view, now = _view(cluster, session)
    kept = decide(doc, view, now, separate_head=False, has_signal=True)
    assert kept.action is WatchAction.KEEP and kept.head == head


def test_decide_elects_when_the_head_ended_and_never_on_an_uncertain_answer() -> None:
    session, cluster, head = running_head()
    _add_worker_record(cluster)
    cluster.end(head, JobState.CANCELLED)
    doc, view, now = _view(cluster, session)
    assert decide(doc, view, now, separate_head=False, has_signal=True).action is WatchAction.ELECT
    cluster.queue_answers = False
    doc, view, now = _view(cluster, session)
    assert decide(doc, view, now, separate_head=True, has_signal=True).action is WatchAction.KEEP


def test_decide_drains_a_head_without_signal_near_its_walltime() -> None:
    session, cluster, head = running_head()
    _add_worker_record(cluster)
    doc, view, now = _view(cluster, session)  # the fake queue says 600 s left
    assert decide(doc, view, now, separate_head=False, has_signal=True).action is WatchAction.KEEP
    late = now + 600 - HANDOVER_LEAD + 1
    assert decide(doc, view, late, separate_head=False,
                  has_signal=False).action is WatchAction.DRAIN


def test_the_watch_of_a_step_process_elects_a_new_head_once_the_head_ended() -> None:
    session, cluster, head = running_head()
    watch = HeadWatch(session.context)
    assert watch.check_once().action is WatchAction.IDLE
    assert watch.interval == WORKER_DISCOVERY_INTERVAL  # a later worker is found within 2 min
    _add_worker_record(cluster)
    assert watch.check_once().action is WatchAction.KEEP and watch.interval == HEAD_CHECK_INTERVAL
    cluster.end(head, JobState.CANCELLED)
    _start_new_heads(cluster)
    assert watch.check_once().action is WatchAction.ELECT
    new_head = cluster.doc()["allocation"]["job_id"]
    assert new_head != head and cluster.jobs[new_head].state is JobState.RUNNING
    assert watch.check_once().action is WatchAction.KEEP


def test_a_running_head_submitted_by_a_dead_elector_is_attached_to_and_recorded_ready() -> None:
    session, cluster, head = running_head()
    cluster.end(head, JobState.CANCELLED)
    dead, _ = new_session(cluster)
    read = cluster.read()
    claim = et.claim_election(read.doc, owner="dead", candidate=None, now=read.now, ttl=20)
    assert isinstance(claim, et.Change) and cluster.apply(claim).ok
    dead.context.retire(head, "job_id", "CANCELLED")
    job_id, mine = submit_head(dead.context, ProgressLog())
    assert mine and cluster.doc()["allocation"]["status"] == "submitted"
    cluster.start(job_id, nodes=("c2",))  # it runs; its submitter died before recording it
    assert session.replace_head(timeout=120).job_id == job_id
    assert cluster.doc()["allocation"].get("ready_at") is not None
    assert cluster.calls["sbatch"] == 2  # no second new head


def test_a_head_whose_ray_stopped_while_its_job_runs_is_replaced() -> None:
    session, cluster, head = ray_running_head()
    _add_worker_record(cluster)
    watch = HeadWatch(session.context)
    assert watch.check_once().action is WatchAction.KEEP
    cluster.ray_stopped[head] = "1800000100"  # the head's step server saw its Ray stop
    _start_new_heads(cluster)
    decision = watch.check_once()
    assert decision.action is WatchAction.ELECT and "stopped while the job runs" in decision.reason
    doc = cluster.doc()
    assert doc["allocation"]["job_id"] != head
    assert any(r.get("job_id") == head and r.get("final_state") == "REPLACED"
               for r in doc["history"].values())
    assert head in cluster.cancelled  # released: it had no unfinished step


def test_a_worker_hosted_head_without_signal_is_handed_over_before_its_walltime() -> None:
    session, cluster, head = running_head()
    _add_worker_record(cluster)
    assert cluster.store.transact([{"op": "add", "path": "/allocation/kind",
                                    "value": et.WORKER_HEAD_KIND}]).ok
    doc, view, now = _view(cluster, session)
    early = decide(doc, view, now, separate_head=False, has_signal=False)
    assert early.action is WatchAction.KEEP
    late = now + 600 - HANDOVER_LEAD + 1
    due = decide(doc, view, late, separate_head=False, has_signal=False)
    assert due.action is WatchAction.DRAIN and "hosts the head" in due.reason
    assert due.head == head
    # with a pre-walltime signal the allocation drains itself: nothing to do yet
    assert decide(doc, view, late, separate_head=False,
                  has_signal=True).action is WatchAction.KEEP
    # once its drain is recorded (a removal, or the head check's own), the head is replaced
    assert cluster.store.transact([{"op": "add", "path": "/workers/" + head,
                                    "value": {"job_id": head, "nodes": ["c1"], "config": {},
                                              "drain_deadline": late + 100}}]).ok
    doc, view, now = _view(cluster, session)
    moved = decide(doc, view, late, separate_head=False, has_signal=False)
    assert moved.action is WatchAction.ELECT and "drains" in moved.reason
