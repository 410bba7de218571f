"""Successor allocations against an in-memory cluster and a fake clock (no real sleeps).

Submission (inheritance, one outstanding successor, the session's job name), promotion
(RUNNING successor only, no active predecessor payload, re-checked after the start, the
predecessor replaced and released, repeated promotion harmless) and a fresh process that
finds the successor in the session document.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from running_heads import CONFIG, new_session, running_head, start_on_promotion

from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.head.handover import START_POLL_INTERVAL, release_allocation
from dagster_slurm.session.head.successor import inherit_config
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr


def test_submit_returns_at_submission_and_inherits_all_but_extra_directives() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor(SlurmRunAllocationConfig(time_limit="00:30:00"))
    assert cluster.jobs[successor.job_id].state is JobState.PENDING  # did not wait for it
    assert successor.predecessor == head and successor.config.signal_before_timeout == "USR1@60"
    spec = cluster.specs[-1]
    assert spec.time_limit == "00:30:00" and spec.partition == "cpu"
    assert spec.job_name == session.job_name  # teardown's scancel --name reaches it
    assert spec.extra_directives in ((), [], None)  # never inherited
    record = cluster.doc()["successor"]
    assert (record["job_id"], record["predecessor"], record["status"]) == (
        successor.job_id, head, "submitted")
    assert "successor allocation" in cluster.files[
        f"{session.paths.submit_dir(successor.token)}/allocation.sh"]


def test_extra_directives_apply_to_the_one_submission_that_names_them() -> None:
    merged = inherit_config(SlurmRunAllocationConfig(**CONFIG).snapshot(),
                            SlurmRunAllocationConfig(extra_sbatch_directives=["--dependency=afterany:12"]))
    assert merged.extra_sbatch_directives == ["--dependency=afterany:12"]
    assert merged.time_limit == "01:00:00"
    again = inherit_config(merged.snapshot(), SlurmRunAllocationConfig())
    assert again.extra_sbatch_directives == []


def test_a_bad_combination_with_inherited_fields_names_the_field() -> None:
    from dagster_slurm.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="signal_before_timeout.*inherited|signal_before_timeout.*current allocation"):
        inherit_config(SlurmRunAllocationConfig(**CONFIG).snapshot(),
                       SlurmRunAllocationConfig(time_limit="00:00:30"))


def test_a_second_successor_is_refused_naming_the_outstanding_one() -> None:
    session, cluster, _ = running_head()
    first = session.submit_successor()
    with pytest.raises(SessionError, match=f"outstanding successor \\(job {first.job_id}"):
        session.submit_successor()
    assert len(cluster.specs) == 2  # the head and one successor


def test_a_successor_that_ended_before_promotion_makes_room_for_another() -> None:
    session, cluster, _ = running_head()
    first = session.submit_successor()
    cluster.end(first.job_id, JobState.CANCELLED)
    second = session.submit_successor()
    doc = cluster.doc()
    assert doc["successor"]["job_id"] == second.job_id
    assert doc["history"][first.job_id]["final_state"] == "CANCELLED"


def test_promotion_requires_a_running_successor() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    with pytest.raises(SessionError, match="is PENDING.*requires a RUNNING successor"):
        session.promote_successor()
    assert cluster.doc()["allocation"]["job_id"] == head
    assert cluster.calls.get("write_files", 0) == 0  # nothing started
    assert cluster.doc()["successor"]["job_id"] == successor.job_id


def test_promotion_refused_while_a_predecessor_payload_is_active() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.run_without_ready(successor.job_id)
    cluster.steps[head] = ["waiting 1a2b", "running asset_a"]
    with pytest.raises(SessionError, match="2 active payload step.*waiting 1a2b; running asset_a"):
        session.promote_successor()
    assert cluster.doc()["allocation"]["job_id"] == head


def test_promotion_publishes_the_successor_and_releases_the_predecessor() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.run_without_ready(successor.job_id)
    start_on_promotion(cluster, successor.job_id)
    allocation = session.promote_successor()
    assert allocation.job_id == successor.job_id and allocation.nodes == ("c2",)
    assert allocation.drain_signal == "USR1"
    assert session.allocation is allocation
    doc = cluster.doc()
    assert doc["allocation"]["job_id"] == successor.job_id
    assert doc["allocation"]["promoted_from"] == head and "successor" not in doc
    assert doc["history"][head]["final_state"] == "REPLACED"
    assert head in cluster.cancelled and successor.job_id not in cluster.cancelled
    assert session.published == [successor.job_id]  # type: ignore[attr-defined]
    # a plan prepared against the predecessor is refused by the launch guard
    stale = tr.launch_step(None, job_id=head)
    assert isinstance(stale, tr.Change) and not cluster.store.transact(stale.patch).ok


def test_a_payload_admitted_during_startup_fails_promotion_until_it_finishes() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.run_without_ready(successor.job_id)

    def started(files: Any) -> None:
        cluster.steps[head] = ["running late_asset"]
        cluster.clock.at(cluster.clock.t + 1, lambda: cluster.start(successor.job_id))

    cluster.on_write = started
    with pytest.raises(SessionError, match="admitted while the successor started"):
        session.promote_successor()
    assert cluster.doc()["allocation"]["job_id"] == head and head not in cluster.cancelled
    cluster.steps[head] = []
    assert session.promote_successor().job_id == successor.job_id
    assert cluster.calls["write_files"] == 1  # started once


def test_repeated_promotion_only_repairs_tags_and_cleanup() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.run_without_ready(successor.job_id)
    start_on_promotion(cluster, successor.job_id)
    session.promote_successor()
    version = cluster.doc()["version"]
    cluster.jobs[head].state = JobState.RUNNING  # the release did not take
    again = session.promote_successor()
    assert again.job_id == successor.job_id
    assert cluster.doc()["version"] == version  # the document is not changed again
    assert session.published == [successor.job_id, successor.job_id]  # type: ignore[attr-defined]
    assert cluster.cancelled.count(head) == 2


def test_a_step_that_slipped_in_before_publication_keeps_the_predecessor_alive() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.run_without_ready(successor.job_id)
    start_on_promotion(cluster, successor.job_id)
    checks = {"n": 0}
    real = cluster.active_steps

    def slipped(job_id: str) -> list[str]:
        checks["n"] += 1
        return ["running late"] if checks["n"] >= 3 else real(job_id)  # after the re-check

    cluster.active_steps = slipped  # type: ignore[method-assign]
    assert session.promote_successor().job_id == successor.job_id
    assert head not in cluster.cancelled
    cluster.active_steps = real  # type: ignore[method-assign]
    session.promote_successor()  # the repair releases it once the step finished
    assert head in cluster.cancelled


def test_a_fresh_process_finds_the_successor_after_its_predecessor_ended() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.end(head, JobState.TIMEOUT)
    session.forget(session.allocation, "TIMEOUT")  # the predecessor is retired
    assert "allocation" not in cluster.doc() or cluster.doc()["allocation"] is None
    fresh, _ = new_session(cluster)
    cluster.run_without_ready(successor.job_id)
    start_on_promotion(cluster, successor.job_id)
    allocation = fresh.promote_successor()
    assert allocation.job_id == successor.job_id
    doc = cluster.doc()
    assert doc["allocation"]["promoted_from"] is None
    assert doc["history"][head]["final_state"] == "TIMEOUT"


def test_the_heartbeat_runs_while_the_caller_waits_for_a_queued_successor() -> None:
    session, cluster, _ = running_head()
    session.close(cancel=False)  # this process stopped using the session ...
    fresh, _ = new_session(cluster)
    beats = cluster.calls.get("beat", 0)
    fresh.submit_successor()  # ... another one queues the successor and waits for it
    assert cluster.calls.get("beat", 0) == beats + 1  # its heartbeat started with a beat


def test_teardown_cancels_a_pending_successor() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    session.close(cancel=True, reason="the run is SUCCESS")
    assert {head, successor.job_id} <= set(cluster.cancelled)
    fresh, _ = new_session(cluster)
    with pytest.raises(SessionError, match="closed"):
        fresh.promote_successor()


# -- promote_successor(wait=...) -------------------------------------------------------------
def test_waiting_promotion_releases_a_drained_predecessor_the_successor_waits_for() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.jobs[successor.job_id].reason = "Resources"
    session.allocation.request_drain = lambda: None  # type: ignore[method-assign]
    cluster.store.transact(tr.request_drain(None, job_id=head).patch)  # what request_drain records

    def freed() -> None:  # the successor starts once the predecessor's nodes are free
        if head in cluster.cancelled:
            cluster.run_without_ready(successor.job_id)
            start_on_promotion(cluster, successor.job_id)
        else:
            cluster.clock.at(cluster.clock.t + 1, freed)

    cluster.clock.at(1, freed)
    lines: list[str] = []
    allocation = session.promote_successor(wait=600, logger=_Lines(lines))
    assert allocation.job_id == successor.job_id
    assert cluster.cancelled[0] == head  # released while the successor was PENDING
    assert any("Released the drained allocation" in line for line in lines)
    assert any("Resources" in line for line in lines)  # the pending reason was said


def test_waiting_promotion_keeps_a_predecessor_that_is_not_drained() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.clock.at(30, lambda: (cluster.run_without_ready(successor.job_id),
                                  start_on_promotion(cluster, successor.job_id)))
    allocation = session.promote_successor(wait=600)
    assert allocation.job_id == successor.job_id
    assert cluster.clock.t >= 30  # it waited for RUNNING
    assert cluster.cancelled == [head]  # released by the promotion, not before it ran


def test_waiting_promotion_keeps_a_drained_predecessor_with_an_unfinished_step() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.drained[head] = "TERM"  # Slurm's pre-walltime signal reached its server
    cluster.steps[head] = ["running asset_a"]
    with pytest.raises(SessionError, match=f"{successor.job_id} did not start within 60 s.*PENDING"):
        session.promote_successor(wait=60)
    assert cluster.cancelled == []  # the step still runs: never cut off
    assert cluster.doc()["successor"]["job_id"] == successor.job_id  # stays queued


def test_waiting_promotion_waits_out_a_scheduler_that_does_not_answer() -> None:
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.drained[head] = "TERM"
    cluster.queue_answers = False
    cluster.clock.at(20, lambda: setattr(cluster, "queue_answers", True))
    cluster.clock.at(40, lambda: (cluster.run_without_ready(successor.job_id),
                                  start_on_promotion(cluster, successor.job_id)))
    assert session.promote_successor(wait=600).job_id == successor.job_id
    assert cluster.cancelled.count(head) == 1


def test_waiting_promotion_raises_for_a_successor_that_ended_in_the_queue() -> None:
    session, cluster, _ = running_head()
    successor = session.submit_successor()
    cluster.clock.at(5, lambda: cluster.end(successor.job_id, JobState.CANCELLED))
    with pytest.raises(SessionError, match=f"{successor.job_id} ended \\(CANCELLED\\) before it started"):
        session.promote_successor(wait=600)


class _Lines:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def info(self, message: str) -> None:
        self.lines.append(message)

    warning = error = debug = info


class _Calls:
    """A SessionIO that records scancel calls in order."""

    def __init__(self, ended: bool = False) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.ended = ended

    def signal_steps(self, job_id: str, signal: str) -> bool:
        self.calls.append(("signal_steps", job_id, signal))
        return not self.ended

    def signal_batch(self, job_id: str, signal: str, files: Any = None) -> bool:
        self.calls.append(("signal_batch", job_id, signal))
        return not self.ended

    def cancel(self, job_ids: Any = (), *, job_name: Any = None) -> None:
        self.calls.append(("cancel", *job_ids))


def test_releasing_with_drain_signal_term_ends_the_ray_steps_then_the_batch_shell() -> None:
    """HUP to the steps ends Ray's processes at once (TERM would stop them one by one); TERM
    would be taken as a drain by the batch shell (it would stay until KillWait): HUP makes
    its step server leave, then the cancel."""
    io = _Calls()
    release_allocation(SimpleNamespace(drain_signal="TERM", io=io), "41")  # type: ignore[arg-type]
    assert io.calls == [("signal_steps", "41", "HUP"), ("signal_batch", "41", "HUP"),
                        ("cancel", "41")]


def test_releasing_an_allocation_that_ended_meanwhile_still_cancels_it() -> None:
    io = _Calls(ended=True)
    release_allocation(SimpleNamespace(drain_signal="TERM", io=io), "41")  # type: ignore[arg-type]
    assert io.calls == [("signal_steps", "41", "HUP"), ("cancel", "41")]


@pytest.mark.parametrize("drain", ["USR1", "HUP", "INT"])
def test_releasing_with_another_drain_signal_is_a_plain_cancel(drain: str) -> None:
    """scancel's TERM then is not the drain signal: the batch shell leaves on it (its Ray
    steps get HUP first all the same)."""
    io = _Calls()
    release_allocation(SimpleNamespace(drain_signal=drain, io=io), "41")  # type: ignore[arg-type]
    assert io.calls == [("signal_steps", "41", "HUP"), ("cancel", "41")]


def test_after_the_release_the_successors_start_is_seen_from_its_output_file() -> None:
    """Once the predecessor is released, the successor's output file (created by Slurm as
    it starts) is read every START_POLL_INTERVAL s, and squeue confirms the start at once."""
    session, cluster, head = running_head()
    successor = session.submit_successor()
    cluster.jobs[successor.job_id].reason = "Resources"
    session.allocation.request_drain = lambda: None  # type: ignore[method-assign]
    cluster.store.transact(tr.request_drain(None, job_id=head).patch)
    started: list[float] = []

    def start() -> None:
        cluster.files[session.paths.output_of(successor.job_id)] = ""
        cluster.run_without_ready(successor.job_id)
        start_on_promotion(cluster, successor.job_id)

    def freed() -> None:
        if head in cluster.cancelled:  # the nodes free, Slurm starts it 4.3 s later
            started.append(cluster.clock.t + 4.3)
            cluster.clock.at(started[0], start)
        else:
            cluster.clock.at(cluster.clock.t + 0.5, freed)

    cluster.clock.at(0.5, freed)
    lines: list[tuple[float, str]] = []
    timed = SimpleNamespace(info=lambda message: lines.append((cluster.clock.t, message)))
    timed.warning = timed.error = timed.debug = timed.info
    session.promote_successor(wait=600, logger=timed)
    runs = [t for t, line in lines if "runs; promoting it" in line]
    assert started and len(runs) == 1
    # seen within a read of the file (a squeue backoff step would be 1 s to 15 s)
    assert runs[0] - started[0] <= START_POLL_INTERVAL + 1e-6
