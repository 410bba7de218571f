"""Head elections: choose_head over random documents and scheduler views, and the claim.

What never happens: two heads named at once, a released, draining or twice-failed
allocation elected, a worker allocation elected with the port strategy ``fixed``, a worker
elected while another eligible one has more time left (at the same number of failed
starts), a choice that depends on anything but its inputs, a live claim taken over, an
expired one left blocked, two electors holding the claim of one term.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import MemoryStateStore, new_session_document
from dagster_slurm.state import election_transitions as el
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.election import (
    HANDOVER_LEAD,
    HeadChoiceKind,
    JobView,
    SchedulerView,
    choose_head,
    eligible_workers,
)
from dagster_slurm.state.schema import SessionDocument

K = HeadChoiceKind
NOW = 10_000.0
HEAD_JOBS = ["11", "12"]
SUCCESSOR_JOBS = ["21"]
WORKER_JOBS = ["31", "32", "33", "34", "135"]
ALL_JOBS = HEAD_JOBS + SUCCESSOR_JOBS + WORKER_JOBS


# -- random inputs -------------------------------------------------------------------------------
def _head() -> st.SearchStrategy[dict[str, Any] | None]:
    return st.none() | st.fixed_dictionaries(
        {"status": st.sampled_from(["submitted", "submitted", "submitting", "failed",
                                    "unknown"]),
         "token": st.just("tok-h"), "kind": st.just("head"),
         "job_id": st.sampled_from(HEAD_JOBS + WORKER_JOBS[:1])},
        optional={"ready_at": st.just(5.0), "drain_requested_at": st.just(6.0)},
    ).map(lambda record: record if "ready_at" in record or record["status"] != "submitted"
          else dict(record, ready_at=5.0)
    )


def _worker(job_id: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"job_id": st.just(job_id), "role": st.just("worker"),
         "released": st.sampled_from([False, False, False, True]),
         "nodes": st.sampled_from([[f"g{job_id}", f"h{job_id}"], []]),
         "drain_deadline": st.sampled_from([None, None, None, NOW + 50])},
    )


# The strategies the composites below draw from, built once (building them anew for every
# draw made Hypothesis validate them again each time).
_HEAD = _head()
_WORKERS = {job_id: _worker(job_id) for job_id in WORKER_JOBS}
_SUCCESSOR = st.fixed_dictionaries(
    {"status": st.sampled_from(["submitting", "submitted"]), "token": st.just("tok-s"),
     "job_id": st.sampled_from(SUCCESSOR_JOBS), "kind": st.just("successor")},
    optional={"drain_requested_at": st.just(7.0)})
_CHOSEN = st.lists(st.sampled_from(WORKER_JOBS), unique=True, min_size=1)
_TERM = st.integers(min_value=0, max_value=3)
_CANDIDATE = st.none() | st.sampled_from(WORKER_JOBS)
_EXPIRES = st.sampled_from([NOW - 1, NOW, NOW + 60])
_FAILURES = st.dictionaries(st.sampled_from(WORKER_JOBS + SUCCESSOR_JOBS),
                            st.integers(min_value=0, max_value=3))
_CLOSED = st.sampled_from([False] * 19 + [True])


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = new_session_document("dsr-run", run_id="run")
    doc["allocation"] = draw(_HEAD)
    if draw(st.booleans()):
        doc["successor"] = draw(_SUCCESSOR)
    chosen = draw(_CHOSEN)
    doc["workers"] = {job_id: draw(_WORKERS[job_id]) for job_id in chosen}
    if draw(st.booleans()):
        claimed = draw(st.booleans())
        doc["election"] = {
            "term": draw(_TERM),
            "candidate": draw(_CANDIDATE),
            "claimed_by": "elector-x" if claimed else None,
            "expires_at": draw(_EXPIRES) if claimed else None,
            "failures": draw(_FAILURES),
        }
    if draw(_CLOSED):
        doc["closed_at"] = 1.0
    return doc


def _job() -> st.SearchStrategy[JobView | None]:
    present = st.builds(
        JobView,
        state=st.sampled_from([JobState.RUNNING] * 6 + [JobState.PENDING, JobState.COMPLETED,
                                                        JobState.CANCELLED, None]),
        end_at=st.sampled_from([NOW + 3600, NOW + 600, NOW + 7200, NOW + 100, NOW + 301,
                                float("inf"), None]),
        nodes=st.sampled_from([("n1", "n2"), ()]),
        ray_alive=st.sampled_from([True, None, True, False]),
        drained=st.sampled_from([False, False, False, True]),
    )
    return st.one_of(present, present, present, st.none())


_JOB = _job()
_CERTAIN = st.integers(min_value=0, max_value=7)


@st.composite
def views(draw: st.DrawFn) -> SchedulerView:
    jobs = {}
    for job_id in ALL_JOBS:
        job = draw(_JOB)
        if job is not None:
            jobs[job_id] = job
    return SchedulerView(jobs, certain=draw(_CERTAIN) > 0)


def _typed(raw: dict[str, Any]) -> SessionDocument:
    doc = tr.document(raw)
    assert doc is not None
    return doc


def _time_left(view: SchedulerView, job_id: str) -> float:
    end = view.jobs[job_id].end_at
    return float("-inf") if end is None else end - NOW


# -- choose_head -------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=documents(), view=views(), fixed=st.booleans())
def test_choose_head_keeps_every_guarantee(raw: dict[str, Any], view: SchedulerView,
                                           fixed: bool) -> None:
    doc = _typed(raw)
    strategy = "fixed" if fixed else "random"
    choice = choose_head(doc, view, NOW, port_strategy=strategy)
    assert choice.reason
    event(choice.kind.value)
    # deterministic, whatever the order of the worker records
    shuffled = dict(raw, workers=dict(random.Random(7).sample(sorted(raw["workers"].items()),
                                                              len(raw["workers"]))))
    assert choose_head(_typed(shuffled), view, NOW, port_strategy=strategy) == choice
    assert choose_head(doc, view, NOW, port_strategy=strategy) == choice

    if doc.closed:
        assert choice.kind is K.CLOSED
        return
    claim = el.claim_state(doc, NOW)
    if claim is el.ClaimState.CLAIMED:  # a live claim is never overtaken
        assert choice.kind is K.WAIT and choice.wait_until == doc.election.expires_at  # type: ignore[union-attr]
        return
    if choice.kind in (K.SUCCESSOR, K.WORKER, K.NEW_ALLOCATION):
        assert view.certain  # an uncertain scheduler elects nothing
        assert choice.term == (doc.election.term if doc.election else 0) + 1
    if choice.kind is K.KEEP:
        assert doc.allocation is not None and choice.job_id == doc.allocation.job_id
        job = view.jobs[str(choice.job_id)]
        assert job.state is JobState.RUNNING and job.ray_alive is not False
        assert doc.allocation.drain_requested_at is None
    if choice.kind is K.SUCCESSOR:
        assert doc.successor is not None and choice.job_id == doc.successor.job_id
        assert view.jobs[str(choice.job_id)].state is JobState.RUNNING
    if choice.kind is K.WORKER:
        _check_worker_choice(doc, view, choice.job_id, choice.node, fixed)
    if choice.kind is K.NEW_ALLOCATION:
        assert not eligible_workers(doc, view, NOW, port_strategy=strategy)


def _check_worker_choice(doc: SessionDocument, view: SchedulerView, job_id: str | None,
                         node: str | None, fixed: bool) -> None:
    assert not fixed and job_id in doc.workers
    record = doc.workers[job_id]
    assert not record.released and record.drain_deadline is None
    assert el.failures(doc, job_id) < el.FAILED_TWICE
    assert doc.allocation is None or doc.allocation.job_id != job_id  # not the failed head
    job = view.jobs[job_id]
    assert job.state is JobState.RUNNING and not job.drained  # nor drains by itself
    assert node == (job.nodes or tuple(record.nodes))[0]
    # the most time left wins among the eligible ones with as few failed starts
    fewest = el.failures(doc, job_id)
    for other, rec in doc.workers.items():
        other_job = view.jobs.get(other)
        if (other == job_id or rec.released or rec.drain_deadline is not None
                or other_job is None or other_job.state is not JobState.RUNNING
                or other_job.drained
                or not (other_job.nodes or rec.nodes)
                or (doc.allocation is not None and doc.allocation.job_id == other)):
            continue
        if (other_job.end_at is not None and other_job.end_at - NOW <= HANDOVER_LEAD):
            continue
        assert el.failures(doc, other) >= fewest or el.failures(doc, other) >= el.FAILED_TWICE
        if el.failures(doc, other) == fewest:
            assert _time_left(view, other) <= _time_left(view, job_id)


def _worker_doc(**workers: dict[str, Any]) -> dict[str, Any]:
    raw = new_session_document("dsr-run")
    raw["workers"] = {job_id: {"job_id": job_id, "nodes": [f"n{job_id}"], **fields}
                      for job_id, fields in workers.items()}
    return raw


def test_the_order_successor_then_most_time_left_then_a_new_allocation() -> None:
    running = JobState.RUNNING
    view = SchedulerView({"21": JobView(running, NOW + 100),
                          "31": JobView(running, NOW + 1000, ("a1",)),
                          "32": JobView(running, NOW + 5000, ("b1", "b2"))})
    raw = _worker_doc(**{"31": {}, "32": {}})
    raw["successor"] = {"status": "submitted", "job_id": "21", "token": "s"}
    assert choose_head(_typed(raw), view, NOW).kind is K.SUCCESSOR
    del raw["successor"]
    choice = choose_head(_typed(raw), view, NOW)
    assert (choice.kind, choice.job_id, choice.node) == (K.WORKER, "32", "b1")
    assert "most time left" in choice.reason
    raw["election"] = {"term": 4, "failures": {"32": 1}}
    choice = choose_head(_typed(raw), view, NOW)
    assert (choice.job_id, choice.term) == ("31", 5)  # a failed start is tried after the others
    raw["election"]["failures"] = {"31": 2, "32": 2}
    assert choose_head(_typed(raw), view, NOW).kind is K.NEW_ALLOCATION
    raw["election"]["failures"] = {}
    fixed = choose_head(_typed(raw), view, NOW, port_strategy="fixed")
    assert fixed.kind is K.NEW_ALLOCATION and "fixed" in fixed.reason


def test_a_healthy_head_is_kept_and_a_failed_one_replaced() -> None:
    raw = _worker_doc(**{"31": {}})
    raw["allocation"] = {"status": "submitted", "job_id": "11", "token": "h", "ready_at": 1.0}
    jobs = {"31": JobView(JobState.RUNNING, NOW + 1000, ("a1",))}
    healthy = SchedulerView({**jobs, "11": JobView(JobState.RUNNING, NOW + 9000, ray_alive=True)})
    assert choose_head(_typed(raw), healthy, NOW).kind is K.KEEP
    ray_down = SchedulerView({**jobs, "11": JobView(JobState.RUNNING, NOW + 9000,
                                                    ray_alive=False)})
    choice = choose_head(_typed(raw), ray_down, NOW)
    assert (choice.kind, choice.replaces) == (K.WORKER, "11") and "Ray head" in choice.reason
    ended = choose_head(_typed(raw), SchedulerView(jobs), NOW)
    assert ended.kind is K.WORKER and "ended" in ended.reason
    unknown = SchedulerView({**jobs, "11": JobView(None)})
    assert choose_head(_typed(raw), unknown, NOW).kind is K.WAIT  # an unknown elects nothing
    assert choose_head(_typed(raw), SchedulerView(jobs, certain=False), NOW).kind is K.WAIT
    # a cancelled head whose processes are still being killed is replaced at once
    completing = choose_head(_typed(raw), SchedulerView({**jobs, "11": JobView(
        JobState.COMPLETING, NOW + 9000)}), NOW)
    assert completing.kind is K.WORKER and "ending (COMPLETING)" in completing.reason
    pending = SchedulerView({**jobs, "11": JobView(JobState.PENDING, None)})
    assert choose_head(_typed(raw), pending, NOW).kind is K.WAIT  # requeued: not an end
    raw["allocation"]["drain_requested_at"] = 2.0
    assert choose_head(_typed(raw), healthy, NOW).kind is K.WORKER  # a draining head hands over


def test_view_from_squeue_counts_time_left_from_the_observation() -> None:
    from dagster_slurm.slurm.parsers import SqueueRecord

    fields = dict.fromkeys(SqueueRecord.__dataclass_fields__)
    record = SqueueRecord(**{**fields, "job_id": "31", "state": JobState.RUNNING,
                             "time_left_seconds": 600.0, "nodes": ("g1", "g2")})
    view = SchedulerView.from_squeue({"31": record}, observed_at=NOW, ray_alive={"31": True})
    assert view.jobs["31"] == JobView(JobState.RUNNING, NOW + 600, ("g1", "g2"), True)


# -- the claim ------------------------------------------------------------------------------------
def _store(raw: dict[str, Any], start: float) -> tuple[MemoryStateStore, list[float]]:
    clock = [start]
    store = MemoryStateStore(raw, clock=lambda: clock[0])
    store.transact([{"op": "replace", "path": "", "value": raw}])
    return store, clock


def _read(store: MemoryStateStore) -> tuple[SessionDocument, float]:
    snap = store.snapshot()
    return _typed(snap.doc or {}), snap.now


def test_an_elector_that_dies_blocks_the_next_election_for_the_lease_only() -> None:
    store, clock = _store(new_session_document("dsr-run"), NOW)
    doc, now = _read(store)
    claim = el.claim_election(doc, owner="a", candidate="31", now=now)
    assert isinstance(claim, tr.Change) and store.transact(claim.patch).ok
    doc, now = _read(store)
    assert el.claim_state(doc, now) is el.ClaimState.CLAIMED
    refused = el.claim_election(doc, owner="b", candidate="32", now=now)
    assert isinstance(refused, tr.Refused) and "claimed by a" in refused.reason
    assert choose_head(doc, SchedulerView(), now).kind is K.WAIT
    clock[0] = NOW + el.CLAIM_TTL - 0.5  # "a" died: no renewal
    doc, now = _read(store)
    assert isinstance(el.claim_election(doc, owner="b", candidate="32", now=now), tr.Refused)
    clock[0] = NOW + el.CLAIM_TTL
    doc, now = _read(store)
    takeover = el.claim_election(doc, owner="b", candidate="32", now=now)
    assert isinstance(takeover, tr.Change) and store.transact(takeover.patch).ok
    doc, now = _read(store)
    assert doc.election is not None
    assert (doc.election.term, doc.election.claimed_by, doc.election.candidate) == (2, "b", "32")
    assert doc.election.failures == {"31": 1}  # the dead elector's start counts as failed
    # the dead elector wakes up: its term is gone
    assert isinstance(el.complete_election(doc, owner="a", term=1, now=now), tr.Refused)


def test_renew_complete_and_fail() -> None:
    store, clock = _store(new_session_document("dsr-run"), NOW)
    doc, now = _read(store)
    assert store.transact(el.claim_election(doc, owner="a", candidate="31",  # type: ignore[union-attr]
                                            now=now).patch).ok
    clock[0] = NOW + 100
    doc, now = _read(store)
    renewed = el.renew_election(doc, owner="a", term=1, now=now)
    assert isinstance(renewed, tr.Change) and store.transact(renewed.patch).ok
    clock[0] = NOW + 200  # past the first lease, within the renewed one
    doc, now = _read(store)
    assert el.claim_state(doc, now) is el.ClaimState.CLAIMED
    failed = el.fail_election(doc, owner="a", term=1, now=now)
    assert isinstance(failed, tr.Change) and store.transact(failed.patch).ok
    assert not store.transact(failed.patch).ok  # never counted twice
    doc, now = _read(store)
    assert el.claim_state(doc, now) is el.ClaimState.FREE and el.failures(doc, "31") == 1
    second = el.claim_election(doc, owner="b", candidate="31", now=now)
    assert isinstance(second, tr.Change) and store.transact(second.patch).ok
    doc, now = _read(store)
    done = el.complete_election(doc, owner="b", term=2, now=now)
    assert isinstance(done, tr.Change) and store.transact(done.patch).ok
    doc, now = _read(store)
    assert el.claim_state(doc, now) is el.ClaimState.FREE
    assert doc.election is not None and doc.election.candidate == "31"
    clock[0] = now + 10 * el.CLAIM_TTL
    late = el.claim_election(doc, owner="c", candidate=None, now=clock[0])
    assert isinstance(late, tr.Change) and store.transact(late.patch).ok
    doc, now = _read(store)
    expired = el.complete_election(doc, owner="c", term=3, now=now + el.CLAIM_TTL)
    assert isinstance(expired, tr.Refused)  # completing needs the unexpired claim


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(
    ["claim", "renew", "complete", "fail"]), st.integers(min_value=0, max_value=2),
    st.sampled_from([0.0, 30.0, 130.0])), max_size=30))
def test_concurrent_electors_never_share_a_term(
        steps: list[tuple[str, str, int, float]]) -> None:
    store, clock = _store(new_session_document("dsr-run"), NOW)
    reads = [_read(store)]
    winners: dict[int, str] = {}
    for owner, action, stale, advance in steps:
        clock[0] += advance
        doc, now = reads[max(0, len(reads) - 1 - stale)]
        term = doc.election.term if doc.election is not None else 0
        if action == "claim":
            decided = el.claim_election(doc, owner=owner, candidate="31", now=now)
        else:
            decided = getattr(el, f"{action}_election")(doc, owner=owner, term=term, now=now)
        if isinstance(decided, tr.Change):
            before_doc, before_now = _read(store)
            before = el.claim_state(before_doc, before_now)
            if store.transact(decided.patch).ok:
                after_doc, after_now = _read(store)
                assert el.ELECTION_TABLE.get((before, decided.transition)) is not None, (
                    before, decided.transition)
                if decided.transition == "claim_election":
                    assert before is not el.ClaimState.CLAIMED  # a live claim is never taken
                    assert after_doc.election is not None
                    new_term = after_doc.election.term
                    assert new_term not in winners  # one elector per term
                    winners[new_term] = owner
                elif decided.transition in ("renew_election", "complete_election"):
                    assert before is el.ClaimState.CLAIMED
        reads.append(_read(store))
    terms = sorted(winners)
    assert terms == list(range(1, len(terms) + 1))


def test_many_processes_one_election() -> None:
    store, _ = _store(_worker_doc(**{"31": {}}), NOW)
    view = SchedulerView({"31": JobView(JobState.RUNNING, NOW + 3600, ("a1",))})
    reads = [_read(store) for _ in range(4)]  # four processes read at once
    outcomes = []
    for index, (doc, now) in enumerate(reads):
        choice = choose_head(doc, view, now)
        assert (choice.kind, choice.job_id) == (K.WORKER, "31")
        claim = el.claim_election(doc, owner=f"p{index}", candidate=choice.job_id, now=now)
        outcomes.append(isinstance(claim, tr.Change) and store.transact(claim.patch).ok)
    assert outcomes.count(True) == 1
    doc, now = _read(store)
    assert all(choose_head(doc, view, now).kind is K.WAIT for _ in itertools.repeat(None, 3))


# -- when to act ---------------------------------------------------------------------------------
def test_a_head_without_signal_is_drained_five_minutes_before_its_walltime() -> None:
    from dagster_slurm.state.election import head_drain_due

    raw = new_session_document("dsr-run")
    raw["allocation"] = {"status": "submitted", "job_id": "11", "token": "h", "ready_at": 1.0}
    doc = _typed(raw)

    def view(left: float | None, certain: bool = True) -> SchedulerView:
        end = None if left is None else NOW + left
        return SchedulerView({"11": JobView(JobState.RUNNING, end)}, certain=certain)

    assert head_drain_due(doc, view(HANDOVER_LEAD), NOW, has_signal=False)
    assert not head_drain_due(doc, view(HANDOVER_LEAD + 1), NOW, has_signal=False)
    assert not head_drain_due(doc, view(10), NOW, has_signal=True)
    assert not head_drain_due(doc, view(None), NOW, has_signal=False)
    assert not head_drain_due(doc, view(10, certain=False), NOW, has_signal=False)
    raw["allocation"]["drain_requested_at"] = 2.0
    assert not head_drain_due(_typed(raw), view(10), NOW, has_signal=False)


def test_workers_are_submitted_again_when_none_is_left() -> None:
    from dagster_slurm.state.election import live_worker_jobs, needs_worker, workers_await_head

    raw = _worker_doc(**{"31": {}, "32": {"released": True}})
    running = SchedulerView({"31": JobView(JobState.RUNNING, NOW + 100)})
    ended = SchedulerView({"31": JobView(JobState.COMPLETED)})
    assert live_worker_jobs(_typed(raw), running) == ["31"]
    assert not needs_worker(_typed(raw), running)
    assert needs_worker(_typed(raw), ended) and needs_worker(_typed(raw), SchedulerView())
    assert not needs_worker(_typed(raw), SchedulerView(certain=False))  # unknown: no submission
    raw["worker_submissions"] = {"t": {"token": "t", "status": "submitting"}}
    assert not needs_worker(_typed(raw), ended)
    # the orphan sensor: live workers without a head wait for one
    assert workers_await_head(_typed(raw), running)
    raw["allocation"] = {"status": "submitted", "job_id": "11", "token": "h", "ready_at": 1.0}
    assert workers_await_head(_typed(raw), running)  # job 11 is not listed: it ended
    both = SchedulerView({**running.jobs, "11": JobView(JobState.RUNNING)})
    assert not workers_await_head(_typed(raw), both)
    assert not workers_await_head(_typed(raw), ended)


# -- the elected worker allocation becomes the head ----------------------------------------------
def test_the_elected_worker_allocation_becomes_the_head_once() -> None:
    raw = _worker_doc(**{"31": {"token": "wt-31", "config": {"partition": "gpu"}}, "32": {}})
    raw["allocation"] = {"status": "submitted", "job_id": "11", "token": "h", "ready_at": 1.0}
    store, clock = _store(raw, NOW)
    view = SchedulerView({"31": JobView(JobState.RUNNING, NOW + 3600, ("a1", "a2")),
                          "11": JobView(JobState.COMPLETED)})
    doc, now = _read(store)
    choice = choose_head(doc, view, now)
    assert (choice.kind, choice.job_id, choice.node, choice.replaces) == (
        K.WORKER, "31", "a1", "11")
    assert store.transact(el.claim_election(doc, owner="p", candidate="31",  # type: ignore[union-attr]
                                            now=now).patch).ok
    doc, now = _read(store)
    wrong = el.install_elected_head(doc, owner="p", term=1, job_id="32", nodes=["b1"],
                                    ray_address="b1:1", now=now)
    assert isinstance(wrong, tr.Refused) and "elects '31'" in wrong.reason
    installed = el.install_elected_head(doc, owner="p", term=1, job_id="31", nodes=["a1"],
                                        ray_address="a1:6379", now=now)
    assert isinstance(installed, tr.Change) and store.transact(installed.patch).ok
    assert not store.transact(installed.patch).ok  # never twice
    doc, now = _read(store)
    head = doc.allocation
    assert head is not None and tr.head_state(doc) is tr.HeadState.READY
    assert (head.kind, head.job_id, head.token, head.nodes, head.promoted_from) == (
        el.WORKER_HEAD_KIND, "31", "wt-31", ["a1"], "11")
    assert head.config == {"partition": "gpu"}
    assert doc.history["11"].final_state == "REPLACED"
    assert el.claim_state(doc, now) is el.ClaimState.FREE
    assert "31" in doc.workers and not doc.workers["31"].released  # it stays a worker
    healthy = SchedulerView({**view.jobs, "31": JobView(JobState.RUNNING, NOW + 3600,
                                                        ("a1", "a2"), True)})
    assert choose_head(doc, healthy, now).kind is K.KEEP


def test_install_needs_a_live_claim_and_an_undrained_worker() -> None:
    raw = _worker_doc(**{"31": {}})
    store, clock = _store(raw, NOW)
    doc, now = _read(store)
    assert store.transact(el.claim_election(doc, owner="p", candidate="31",  # type: ignore[union-attr]
                                            now=now).patch).ok
    doc, now = _read(store)
    stale = el.install_elected_head(doc, owner="p", term=1, job_id="31", nodes=["n31"],
                                    ray_address=None, now=now)
    assert isinstance(stale, tr.Change)
    from dagster_slurm.state import worker_transitions as wt

    assert store.transact(wt.request_worker_drain(doc, job_id="31",  # type: ignore[union-attr]
                                                  drain_timeout=60).patch).ok
    assert not store.transact(stale.patch).ok  # the worker record changed: a conflict
    doc, now = _read(store)
    drained = el.install_elected_head(doc, owner="p", term=1, job_id="31", nodes=["n31"],
                                      ray_address=None, now=now)
    assert isinstance(drained, tr.Refused) and "undrained" in drained.reason
    clock[0] = NOW + el.CLAIM_TTL + 1
    doc, now = _read(store)
    late = el.install_elected_head(doc, owner="p", term=1, job_id="31", nodes=["n31"],
                                   ray_address=None, now=now)
    assert isinstance(late, tr.Refused) and "expired" in late.reason
