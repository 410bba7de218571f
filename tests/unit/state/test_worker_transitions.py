"""Worker allocations' transitions: the table, the agent's patches, and random sequences.

Random sequences of worker transitions, each decided on the current document or on one read
a few steps earlier, applied through the in-memory store: every applied change follows an
edge of the table from the state it met, no transition is applied twice for the same
allocation (a second drain, release or settlement fails its guard or is refused), no worker
record is lost, a released allocation never comes back, and every refusal says why.
"""

from __future__ import annotations

import inspect
import itertools
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagster_slurm.state import MemoryStateStore, new_session_document
from dagster_slurm.state import election_transitions as el
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt
from dagster_slurm.state.schema import SessionDocument

W = wt.WorkerState
TOKENS = ["wt-a", "wt-b"]
JOBS = ["31", "32", "33"]


def _store(doc: dict[str, Any] | None = None) -> MemoryStateStore:
    clock = itertools.count(1000)
    initial = doc or new_session_document("dsr-run", run_id="run")
    store = MemoryStateStore(initial, clock=lambda: float(next(clock)))
    store.transact([{"op": "replace", "path": "", "value": initial}])
    return store


def _doc(store: MemoryStateStore) -> SessionDocument:
    doc = tr.document(store.snapshot().doc)
    assert doc is not None
    return doc


def _apply(store: MemoryStateStore, outcome: tr.Outcome) -> bool:
    assert isinstance(outcome, tr.Change), outcome
    return store.transact(outcome.patch).ok


# -- the table and the design document ----------------------------------------------------------
def test_every_edge_is_unique_explained_and_has_its_function() -> None:
    seen = set()
    for edge in wt.WORKER_TRANSITIONS:
        assert (edge.source, edge.name) not in seen
        seen.add((edge.source, edge.name))
        assert len(edge.why) > 20
        function = wt.worker_submit_failed if edge.name == "worker_submit_in_doubt" else getattr(
            wt, edge.name)
        assert "doc" in inspect.signature(function).parameters


def test_the_design_document_lists_every_worker_and_election_edge() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "design.md").read_text()
    edges = [*wt.WORKER_TRANSITIONS, *el.ELECTION_TRANSITIONS]
    for edge in edges:
        row = (f"| {edge.source.value.upper()} | `{edge.name}` | {edge.target.value.upper()} "
               f"| {edge.why} |")
        assert row in text, row


def test_released_is_final_and_absent_only_submits() -> None:
    for state in W:
        targets = {name for (source, name) in wt.WORKER_TABLE if source is state}
        if state is W.RELEASED or state is W.UNRECOGNIZED:
            assert not targets
        if state is W.ABSENT:
            assert targets == {"submit_worker"}


def test_a_whole_life_and_no_transition_twice() -> None:
    store = _store()
    assert _apply(store, wt.submit_worker(_doc(store), token="wt-a", config={"num_nodes": 1},
                                          shape={}))
    assert isinstance(wt.submit_worker(_doc(store), token="wt-a", config={}, shape={}),
                      tr.Refused)
    stale = _doc(store)
    assert _apply(store, wt.worker_submitted(stale, token="wt-a", job_id="31"))
    assert not _apply(store, wt.worker_submitted(stale, token="wt-a", job_id="32"))
    doc = _doc(store)
    assert wt.worker_state(doc, token="wt-a") is W.SUBMITTED
    record = doc.workers["31"]
    assert (record.token, record.config, record.released, record.submitted_at) == (
        "wt-a", {"num_nodes": 1}, False, doc.worker_submissions["wt-a"].submitted_at)
    assert _apply(store, wt.record_worker_joined(_doc(store), job_id="31", nodes=["g1"],
                                                 ray_node_ids={"g1": "ray-1"}))
    stale = _doc(store)
    assert _apply(store, wt.record_worker_joined(stale, job_id="31", nodes=["g1"],
                                                 ray_node_ids={"g1": "ray-2"}))
    # an older process's join does not overwrite the newer head's ids
    assert not _apply(store, wt.record_worker_joined(stale, job_id="31", nodes=["g1"],
                                                     ray_node_ids={"g1": "ray-old"}))
    assert _doc(store).workers["31"].ray_node_ids == {"g1": "ray-2"}
    stale = _doc(store)
    assert _apply(store, wt.request_worker_drain(stale, job_id="31", drain_timeout=900))
    assert not _apply(store, wt.request_worker_drain(stale, job_id="31", drain_timeout=10))
    doc = _doc(store)
    assert wt.worker_state(doc, job_id="31") is W.DRAINING
    deadline = doc.workers["31"].drain_deadline
    assert deadline is not None and deadline > 900
    again = wt.request_worker_drain(doc, job_id="31", drain_timeout=10)
    assert isinstance(again, tr.Refused) and "draining already" in again.reason
    stale = _doc(store)
    assert _apply(store, wt.release_worker(stale, job_id="31"))
    assert not _apply(store, wt.release_worker(stale, job_id="31"))
    assert isinstance(wt.release_worker(_doc(store), job_id="31"), tr.Refused)
    assert wt.live_workers(_doc(store)) == {}


def test_failed_and_in_doubt_submissions_settle_when_squeue_lists_the_token() -> None:
    store = _store()
    for token in TOKENS:
        assert _apply(store, wt.submit_worker(_doc(store), token=token, config={}, shape={}))
    assert _apply(store, wt.worker_submit_failed(_doc(store), token="wt-a", error="sbatch: no"))
    assert _apply(store, wt.worker_submit_failed(_doc(store), token="wt-b", error="timeout",
                                                 in_doubt=True))
    doc = _doc(store)
    assert (wt.worker_state(doc, token="wt-a"), wt.worker_state(doc, token="wt-b")) == (
        W.FAILED, W.IN_DOUBT)
    assert doc.worker_submissions["wt-a"].error == "sbatch: no"
    assert _apply(store, wt.settle_worker_found(_doc(store), token="wt-b", job_id="32"))
    refused = wt.settle_worker_found(_doc(store), token="wt-a", job_id="32")
    assert isinstance(refused, tr.Refused) and "already has a worker record" in refused.reason


def test_a_submission_squeue_does_not_know_is_settled_as_failed() -> None:
    store = _store()
    assert _apply(store, wt.submit_worker(_doc(store), token="wt-a", config={}, shape={}))
    stale = _doc(store)
    assert _apply(store, wt.settle_worker_lost(stale, token="wt-a"))
    assert not _apply(store, wt.settle_worker_lost(stale, token="wt-a"))
    doc = _doc(store)
    assert wt.worker_state(doc, token="wt-a") is W.FAILED
    assert "no job carrying the token" in str(doc.worker_submissions["wt-a"].error)


def test_a_closed_session_submits_no_worker() -> None:
    raw = new_session_document("dsr-run")
    raw["closed_at"], raw["closed_reason"] = 5.0, "teardown"
    refused = wt.submit_worker(tr.document(raw), token="wt-a", config={}, shape={})
    assert isinstance(refused, tr.Refused) and "closed (teardown)" in refused.reason
    store = _store()
    decided = wt.submit_worker(_doc(store), token="wt-a", config={}, shape={})
    store.transact(tr.close_session(None, reason="teardown").patch)  # type: ignore[union-attr]
    assert not _apply(store, decided)


# -- random sequences ----------------------------------------------------------------------------
def _op() -> st.SearchStrategy[tuple[str, dict[str, Any], int]]:
    token, job = st.sampled_from(TOKENS), st.sampled_from(JOBS)
    stale = st.integers(min_value=0, max_value=3)

    def op(name: str, **fields: Any) -> st.SearchStrategy[tuple[str, dict[str, Any], int]]:
        return st.tuples(st.just(name), st.fixed_dictionaries(fields), stale)

    return st.one_of(
        op("submit_worker", token=token, config=st.just({"n": 1}), shape=st.just({})),
        op("worker_submitted", token=token, job_id=job),
        op("worker_submit_failed", token=token, error=st.just("e"), in_doubt=st.booleans()),
        op("settle_worker_found", token=token, job_id=job),
        op("settle_worker_lost", token=token),
        op("record_worker_joined", job_id=job, nodes=st.just(["g1"]),
           ray_node_ids=st.sampled_from([{"g1": "r1"}, {"g1": "r2"}])),
        op("request_worker_drain", job_id=job, drain_timeout=st.sampled_from([0, 60])),
        op("release_worker", job_id=job),
    )


def _states(doc: dict[str, Any]) -> dict[str, W]:
    typed = tr.document(doc)
    states = {f"t:{t}": wt.worker_state(typed, token=t) for t in TOKENS}
    states.update({f"j:{j}": wt.worker_state(typed, job_id=j) for j in JOBS})
    return states


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op(), max_size=40))
def test_random_sequences_follow_the_table(ops: list[tuple[str, dict[str, Any], int]]) -> None:
    store = _store()
    reads = [store.snapshot().doc]
    released: set[str] = set()
    for name, inputs, stale in ops:
        before = store.snapshot().doc
        assert before is not None
        basis = tr.document(reads[max(0, len(reads) - 1 - stale)])
        decided = getattr(wt, name)(basis, **inputs)
        if isinstance(decided, tr.Refused):
            assert decided.reason and decided.transition in str(decided)
            continue
        result = store.transact(decided.patch)
        after = store.snapshot().doc
        assert after is not None
        SessionDocument.from_dict(after)
        if not result.ok:
            assert after == before
        else:
            pre, post = _states(before), _states(after)
            # every change is an edge of the table, from the state it met (a job's record
            # appearing is its token's edge, checked under the token)
            changed = [key for key in pre if pre[key] != post[key]
                       and not (key.startswith("j:") and pre[key] is W.ABSENT)]
            for key in changed:
                assert wt.worker_allowed(pre[key], decided.transition) == post[key], (
                    key, pre[key], decided.transition, post[key])
            assert set(before.get("workers") or {}) <= set(after.get("workers") or {})
            for job_id in released:
                assert after["workers"][job_id]["released"] is True
        released |= {j for j, r in (after.get("workers") or {}).items() if r.get("released")}
        reads.append(after)
