"""The WORKER path of replace_head against an in-memory cluster and a fake clock: the
elector asks the worker allocation to host the head (``jobs/<id>/host_head``), waits for its
step server's ready file, installs it as the head record and caches its allocation; a
reported failure or a timeout fails the claim (withdrawing the request) and elects again;
a worker allocation that hosts the head is not removed.
"""

from __future__ import annotations

import functools
from typing import Any

from running_heads import ray_running_head, running_head
from session_fakes import FakeCluster, FakeJob

from dagster_slurm.session.head.worker_host import (
    HOST_POLL_INTERVAL,
    HOST_TIMEOUT,
    host_head_path,
    host_state_path,
)
from dagster_slurm.session.workers.removal import remove_worker_allocation
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import election_transitions as et


def _add_worker(cluster: FakeCluster, session: Any, job_id: str, node: str) -> None:
    """A running worker allocation of the session, recorded as add_worker_allocation does."""
    cluster.jobs[job_id] = FakeJob(job_id, session.job_name, f"t{job_id}", JobState.RUNNING,
                                   None, (node,))
    assert cluster.store.transact([
        {"op": "add", "path": f"/workers/{job_id}",
         "value": {"job_id": job_id, "token": f"t{job_id}", "nodes": [node], "config": {}}},
    ]).ok


def _answer(cluster: FakeCluster, session: Any, answers: dict[str, str | None]) -> list[str]:
    """Each worker allocation answers a host_head request after 5 s: ``ready`` (its step
    server's ready file with a Ray address), ``failed`` (host_head_state) or None (never).
    Returns the requests seen, in order."""
    seen: list[str] = []

    def on_write(files: Any) -> None:
        for path, (content, _mode) in files.items():
            for job_id, answer in answers.items():
                if path != host_head_path(session, job_id) or not content.startswith("term="):
                    continue
                seen.append(f"{job_id} {content.strip()}")
                term = content.strip().removeprefix("term=")
                node = cluster.jobs[job_id].nodes[0]
                if answer == "ready":
                    address = f"10.0.0.9:{6000 + int(term)}"
                    cluster.files[host_state_path(session, job_id)] = (
                        f"started term={term} ray_address={address}\n")
                    path = session.paths.ready(job_id)
                    text = f"head={node}\nray_address={address}\n"
                elif answer == "failed":
                    path = host_state_path(session, job_id)
                    text = f"failed term={term} 'ray start --head' ended\n"
                else:
                    continue
                hook = functools.partial(cluster.files.__setitem__, path, text)
                cluster.clock.at(cluster.clock.t + 5, hook)

    cluster.on_write = on_write
    return seen


def test_a_lost_head_is_replaced_by_the_worker_allocation_hosting_a_control_plane() -> None:
    session, cluster, head = running_head()
    _add_worker(cluster, session, "900", "g1")
    seen = _answer(cluster, session, {"900": "ready"})
    cluster.end(head, JobState.CANCELLED)
    allocation = session.replace_head(timeout=180)
    assert allocation.job_id == "900" and allocation.ray_address == "10.0.0.9:6001"
    assert seen == ["900 term=1"]
    doc = cluster.doc()
    assert doc["allocation"]["job_id"] == "900"
    assert doc["allocation"]["kind"] == et.WORKER_HEAD_KIND
    assert doc["allocation"]["nodes"] == ["g1"]
    assert doc["election"]["claimed_by"] is None
    assert any(r.get("job_id") == head for r in doc["history"].values())
    assert cluster.calls["sbatch"] == 1  # no new allocation
    assert session.current_allocation() is allocation
    # every later caller gets the same head
    assert session.replace_head(timeout=10).job_id == "900"


def test_the_hosted_head_is_seen_at_once_without_more_squeue() -> None:
    """The elector reads ready and host_head_state every HOST_POLL_INTERVAL seconds, and
    asks squeue only at its backoff's pace (0.5 s growing to 3 s)."""
    session, cluster, head = running_head()
    _add_worker(cluster, session, "900", "g1")
    _answer(cluster, session, {"900": "ready"})  # 5 s after the request
    asked: list[float] = []
    answer = cluster.on_write

    def on_write(files: Any) -> None:
        if host_head_path(session, "900") in files:
            asked.append(cluster.clock.t)
        answer(files)

    cluster.on_write = on_write
    cluster.end(head, JobState.CANCELLED)
    assert session.replace_head(timeout=180).job_id == "900"
    assert asked and cluster.clock.t <= asked[0] + 5 + HOST_POLL_INTERVAL + 1e-6
    cluster.calls.clear()
    cluster.end("900", JobState.CANCELLED)
    _add_worker(cluster, session, "901", "g2")
    _answer(cluster, session, {"901": "ready"})
    assert session.replace_head(timeout=180).job_id == "901"
    # over the 5 s of the wait: squeue at 0, 0.5, 1.25, 2.4 and 4.1 s, not once per read
    assert cluster.calls["poll_files_with_squeue"] <= 5 < cluster.calls["poll_files"]


def test_a_reported_failure_fails_the_claim_and_the_next_worker_allocation_is_elected() -> None:
    session, cluster, head = running_head()
    _add_worker(cluster, session, "900", "g1")
    _add_worker(cluster, session, "901", "g2")
    seen = _answer(cluster, session, {"900": "failed", "901": "ready"})
    cluster.end(head, JobState.CANCELLED)
    allocation = session.replace_head(timeout=180)
    assert seen == ["900 term=1", "901 term=2"]
    assert allocation.job_id == "901"
    assert cluster.files[host_head_path(session, "900")] == "stop term=1\n"
    read = cluster.read()
    assert et.failures(read.doc, "900") == 1 and et.failures(read.doc, "901") == 0


def test_a_worker_allocation_that_never_answers_is_passed_over_after_two_timeouts() -> None:
    session, cluster, head = running_head()
    _add_worker(cluster, session, "900", "g1")
    seen = _answer(cluster, session, {"900": None})
    cluster.end(head, JobState.CANCELLED)
    submitted: list[str] = []

    def start_new(job: FakeJob) -> None:
        submitted.append(job.job_id)
        cluster.clock.at(cluster.clock.t + 3, lambda: cluster.start(job.job_id, nodes=("c2",)))

    cluster.on_submit = start_new
    started = cluster.clock.t
    allocation = session.replace_head(timeout=3 * HOST_TIMEOUT + 60)
    assert seen == ["900 term=1", "900 term=2"]
    assert allocation.job_id == submitted[0]  # a new allocation after the second failure
    assert cluster.clock.t - started >= 2 * HOST_TIMEOUT
    assert cluster.files[host_head_path(session, "900")] == "stop term=2\n"
    assert et.failures(cluster.read().doc, "900") == 2


def test_a_worker_allocation_that_ends_while_asked_fails_at_once() -> None:
    session, cluster, head = running_head()
    _add_worker(cluster, session, "900", "g1")
    _answer(cluster, session, {"900": None})
    cluster.on_write_base = cluster.on_write  # type: ignore[attr-defined]

    def ends(files: Any) -> None:
        cluster.on_write_base(files)  # type: ignore[attr-defined]
        if host_head_path(session, "900") in files:
            cluster.clock.at(cluster.clock.t + 4, lambda: cluster.end("900", JobState.NODE_FAIL))

    cluster.on_write = ends
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 3, lambda: cluster.start(job.job_id, nodes=("c2",)))
    cluster.end(head, JobState.CANCELLED)
    started = cluster.clock.t
    allocation = session.replace_head(timeout=600)
    assert allocation.job_id not in (head, "900")
    assert cluster.clock.t - started < HOST_TIMEOUT


def test_removing_the_worker_allocation_hosting_the_head_hands_the_head_over_first() -> None:
    session, cluster, head = running_head()
    _add_worker(cluster, session, "900", "g1")
    _add_worker(cluster, session, "901", "g2")
    cluster.jobs["901"].time_left = 450.0  # 900 has the most time left: elected first
    seen = _answer(cluster, session, {"900": "ready", "901": "ready"})
    cluster.end(head, JobState.CANCELLED)
    assert session.replace_head(timeout=180).job_id == "900"

    def drained_when_idle(job: FakeJob, signal: str) -> None:
        # the batch script drains; its nodes are idle, so it ends 10 s later
        cluster.clock.at(cluster.clock.t + 10, lambda: cluster.end(job.job_id, JobState.COMPLETED))

    cluster.on_signal = drained_when_idle
    state = remove_worker_allocation(session.context, "900", drain_timeout=120)
    assert state is JobState.COMPLETED
    assert seen == ["900 term=1", "901 term=2"]  # the next head: the other worker allocation
    (signalled, signal, doc_then), = cluster.signals
    assert (signalled, signal) == ("900", "USR1")
    # the drain deadline was in the document before the signal went out
    assert doc_then["workers"]["900"]["drain_deadline"] is not None
    doc = cluster.doc()
    assert doc["allocation"]["job_id"] == "901" and doc["allocation"]["kind"] == et.WORKER_HEAD_KIND
    assert doc["workers"]["900"]["released"]
    assert "900" not in cluster.cancelled  # it drained; nothing cancelled it


def test_a_head_hosted_by_a_worker_allocation_that_drains_itself_is_replaced() -> None:
    session, cluster, head = ray_running_head()  # the markers are read with Ray
    _add_worker(cluster, session, "900", "g1")
    seen = _answer(cluster, session, {"900": "ready"})
    cluster.end(head, JobState.CANCELLED)
    assert session.replace_head(timeout=180).job_id == "900"
    assert session.replace_head(timeout=10).job_id == "900"  # healthy: kept
    cluster.drained["900"] = "TERM"  # its step server recorded a drain (pre-walltime signal)
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 3, lambda: cluster.start(job.job_id, nodes=("c2",)))
    allocation = session.replace_head(timeout=180)
    # no other host: a new allocation shaped like the first head; the drained one is not asked
    assert allocation.job_id not in (head, "900")
    assert seen == ["900 term=1"]


def test_a_worker_allocation_that_drains_itself_is_not_asked_to_host_the_head() -> None:
    # Its pre-walltime signal made it drain (its state file says so) without the session
    # asking: the document has no drain deadline for it, yet it must not be elected.
    session, cluster, head = ray_running_head()
    _add_worker(cluster, session, "900", "g1")
    _add_worker(cluster, session, "901", "g2")
    seen = _answer(cluster, session, {"900": "ready", "901": "ready"})
    cluster.files[session.paths.worker_state("900")] = "draining\n"
    cluster.end(head, JobState.CANCELLED)
    allocation = session.replace_head(timeout=180)
    assert allocation.job_id == "901"
    assert seen == ["901 term=1"]
