"""The session document's transition table, and properties of random transition sequences.

Random documents and random sequences of transitions, each decided on the current document
or on a stale copy (as a process that read the document earlier would), applied through the
in-memory store (the agent's patch code). Whatever happens: no record is lost, there are never
two heads, no transition produces a state the table does not know, a closed session gets no
new submission, every applied change follows an edge of the table, and every refusal says why.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagster_slurm.state import MemoryStateStore, new_session_document
from dagster_slurm.state import election_transitions as st_election
from dagster_slurm.state import successor_transitions as st_succ
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import Allocation, SessionDocument

JOB_IDS = ["11", "12", "13"]
TOKENS = ["tok-a", "tok-b", "tok-c"]
SUCCESSOR_JOB_IDS = ["21", "22"]
SUCCESSOR_NAMES = ("submit_successor", "successor_submitted", "successor_submit_failed",
                   "retire_successor", "promote_successor")


def _function(name: str) -> Any:
    """A transition function by name (the successor's and the election's live in their
    own modules)."""
    return (getattr(tr, name, None) or getattr(st_succ, name, None)
            or getattr(st_election, name, None))


# -- the table --------------------------------------------------------------------------------
def test_every_edge_is_unique_explained_and_has_its_transition_function() -> None:
    seen: set[tuple[Any, str]] = set()
    for edge in tr.TRANSITIONS:
        assert (edge.source, edge.name) not in seen, edge
        seen.add((edge.source, edge.name))
        assert len(edge.why) > 20, edge
        function = _function(edge.name)
        if edge.name in ("head_submit_in_doubt",):
            function = tr.head_submit_failed
        assert callable(function), edge.name
        assert "doc" in inspect.signature(function).parameters


def test_every_state_but_absent_can_be_retired_and_absent_only_submits() -> None:
    for state in tr.HeadState:
        if state is tr.HeadState.ABSENT:
            assert tr.allowed(state, "retire") is None
            assert tr.allowed(state, "submit_head") is tr.HeadState.SUBMITTING
        else:
            assert tr.allowed(state, "retire") is tr.HeadState.ABSENT
            assert tr.allowed(state, "submit_head") is None
        assert tr.allowed(state, "beat") is state and tr.allowed(state, "close_session") is state


def test_head_state_reads_each_record_shape() -> None:
    def state(**record: Any) -> tr.HeadState:
        doc = new_session_document("j")
        doc["allocation"] = record
        return tr.head_state(tr.document(doc))

    assert tr.head_state(tr.document(new_session_document("j"))) is tr.HeadState.ABSENT
    assert state(status="submitting", token="t") is tr.HeadState.SUBMITTING
    assert state(status="submitted", job_id="1") is tr.HeadState.SUBMITTED
    assert state(status="submitted", job_id="1", ready_at=1.0) is tr.HeadState.READY
    assert state(status="submitted", job_id="1", ready_at=1.0,
                 drain_requested_at=2.0) is tr.HeadState.DRAINING
    assert state(status="failed") is tr.HeadState.FAILED
    assert state(status="unknown") is tr.HeadState.IN_DOUBT
    assert state(status="submitted") is tr.HeadState.UNRECOGNIZED  # no job id
    assert state(status="running", job_id="1") is tr.HeadState.UNRECOGNIZED


def test_refusals_say_which_transition_and_why() -> None:
    closed = new_session_document("dsr-run")
    closed["closed_at"], closed["closed_reason"] = 5.0, "the run is SUCCESS"
    refused = tr.submit_head(tr.document(closed), token="t", config={})
    assert isinstance(refused, tr.Refused)
    assert "closed (the run is SUCCESS)" in refused.reason and "submit_head" in str(refused)
    absent = tr.record_ready(tr.document(new_session_document("j")), job_id="1", nodes=[],
                             ray_address=None)
    assert isinstance(absent, tr.Refused) and "no longer the one with job_id '1'" in absent.reason


# -- random documents and sequences -----------------------------------------------------------
def _consistent(record: dict[str, Any]) -> bool:
    """Records the library can write: ready and drain times only on a submitted job."""
    submitted = record["status"] == "submitted" and record["job_id"] is not None
    return submitted or (record.get("ready_at") is None
                         and record.get("drain_requested_at") is None)


def _record() -> st.SearchStrategy[dict[str, Any] | None]:
    times = st.none() | st.floats(min_value=0, max_value=2e9, allow_nan=False)
    return st.none() | st.fixed_dictionaries(
        {
            "status": st.sampled_from(["submitting", "submitted", "failed", "unknown", "running"]),
            "token": st.sampled_from(TOKENS),
            "job_id": st.none() | st.sampled_from(JOB_IDS),
            "kind": st.just("head"),
        },
        optional={
            "ready_at": times, "drain_requested_at": times, "submitted_at": times,
            "error": st.text(max_size=5), "nodes": st.lists(st.sampled_from(["c1", "c2"])),
            "from_a_newer_library": st.integers(),
        },
    ).filter(_consistent)


def _successor() -> st.SearchStrategy[dict[str, Any] | None]:
    return st.none() | st.fixed_dictionaries(
        {
            "status": st.sampled_from(["submitting", "submitted", "failed"]),
            "token": st.sampled_from(["tok-s1", "tok-s2"]),
            "job_id": st.none() | st.sampled_from(SUCCESSOR_JOB_IDS),
            "kind": st.just("successor"),
        },
    )


# Built once: a strategy built anew for every draw is validated again by Hypothesis each time.
_RECORD = _record()
_SUCCESSOR = _successor()
_ONE_IN_SIX = st.integers(min_value=0, max_value=5)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = new_session_document("dsr-run", run_id="run")
    doc["allocation"] = draw(_RECORD)
    successor = draw(_SUCCESSOR)
    if successor is not None:
        doc["successor"] = successor
    if draw(_ONE_IN_SIX) == 0:
        doc["closed_at"], doc["closed_reason"] = 10.0, "teardown"
    return doc


def _aimed(inputs: dict[str, Any], basis: SessionDocument | None) -> dict[str, Any]:
    """Most operations aim at the head record as read (as the library's do); the rest keep
    their random token or job id."""
    record = basis.allocation if basis is not None else None
    if "predecessor" in inputs:
        # the successor's transitions aim at the successor as read, and at the head
        successor = basis.successor if basis is not None else None
        if inputs.pop("aimed", False):
            for key in ("token", "job_id"):
                if key in inputs and successor is not None and getattr(successor, key):
                    inputs[key] = getattr(successor, key)
            inputs["predecessor"] = record.job_id if record is not None else None
        return inputs
    if record is None or not inputs.pop("aimed", False):
        inputs.pop("aimed", None)
        return inputs
    for key in ("token", "job_id"):
        if key in inputs and getattr(record, key) and not (
                key == "job_id" and "token" in inputs):
            inputs[key] = getattr(record, key)
    if inputs.get("key") in ("token", "job_id") and getattr(record, inputs["key"]):
        inputs["value"] = getattr(record, inputs["key"])
    return inputs


def _op() -> st.SearchStrategy[tuple[str, dict[str, Any], int]]:
    job = st.sampled_from(JOB_IDS)
    token = st.sampled_from(TOKENS)
    stale = st.integers(min_value=0, max_value=3)  # decide on the document read k steps ago
    aimed = st.integers(min_value=0, max_value=4).map(bool)  # aimed four times in five

    def op(name: str, fields: dict[str, Any]) -> st.SearchStrategy[tuple[str, dict[str, Any], int]]:
        return st.tuples(st.just(name), st.fixed_dictionaries({**fields, "aimed": aimed}), stale)

    return st.one_of(
        st.tuples(st.just("submit_head"), st.fixed_dictionaries({}), stale),
        op("head_submitted", {"token": token, "job_id": job}),
        op("head_submit_failed", {"token": token, "error": st.just("sbatch: error"),
                                  "in_doubt": st.booleans()}),
        op("settle_found", {"token": token, "job_id": job}),
        op("record_ready", {"job_id": job, "nodes": st.just(["c1"]), "ray_address": st.just("h:1")}),
        op("launch_step", {"job_id": job}),
        op("request_drain", {"job_id": job}),
        op("retire", {"key": st.just("job_id"), "value": job, "final_state": st.just("COMPLETED")}),
        op("retire", {"key": st.just("token"), "value": token, "final_state": st.just("unknown")}),
        op("beat", {"host": st.just("h"), "pid": st.just(1)}),
        st.tuples(st.just("submit_successor"), st.fixed_dictionaries({}), stale),
        op("successor_submitted", {"token": st.sampled_from(["tok-s1", "tok-s2"]),
                                   "job_id": st.sampled_from(SUCCESSOR_JOB_IDS),
                                   "predecessor": st.none()}),
        op("successor_submit_failed", {"token": st.sampled_from(["tok-s1", "tok-s2"]),
                                       "error": st.just("sbatch: error"),
                                       "predecessor": st.none()}),
        op("retire_successor", {"token": st.sampled_from(["tok-s1", "tok-s2"]),
                                "final_state": st.just("CANCELLED"), "predecessor": st.none()}),
        op("promote_successor", {"job_id": st.sampled_from(SUCCESSOR_JOB_IDS),
                                 "predecessor": st.none() | st.sampled_from(JOB_IDS),
                                 "nodes": st.just(["c2"]), "ray_address": st.just("h:2")}),
        op("close_session", {"reason": st.just("teardown")}).filter(lambda o: o[2] == 0),
    )


def _name(record: dict[str, Any]) -> str:
    return str(record.get("job_id") or record.get("token"))


def _identity(record: dict[str, Any] | None) -> str | None:
    return None if record is None else str(record.get("token"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=documents(), ops=st.lists(_op(), max_size=40))
def test_random_sequences_keep_every_guarantee(initial: dict[str, Any],
                                               ops: list[tuple[str, dict[str, Any], int]]) -> None:
    clock = itertools.count(100)
    store = MemoryStateStore(initial, clock=lambda: float(next(clock)))
    store.transact([{"op": "replace", "path": "", "value": initial}])
    fresh = (f"tok-new-{i}" for i in itertools.count())
    history_of_reads = [store.snapshot().doc]
    seen = {_identity(initial.get("allocation")), _identity(initial.get("successor"))} - {None}
    for name, inputs, stale in ops:
        before = store.snapshot().doc
        assert before is not None
        read = history_of_reads[max(0, len(history_of_reads) - 1 - stale)]
        basis = tr.document(read)
        if name == "submit_head":
            inputs = {"token": next(fresh), "config": {"num_nodes": 1}}
        elif name == "submit_successor":
            head = basis.allocation if basis is not None else None
            inputs = {"token": next(fresh), "config": {"num_nodes": 1},
                      "predecessor": str(head.job_id) if head is not None else "11"}
        else:
            inputs = _aimed(dict(inputs), basis)
        if name in SUCCESSOR_NAMES[1:4]:
            inputs.pop("predecessor", None)
        decided = _function(name)(basis, **inputs)
        if isinstance(decided, tr.Refused):
            assert decided.transition in (name, "head_submit_in_doubt") and decided.reason
            assert decided.transition in str(decided)
            continue
        assert decided.transition in (name, "head_submit_in_doubt")
        result = store.transact(decided.patch)
        after = store.snapshot().doc
        assert after is not None
        SessionDocument.from_dict(after)  # always a valid document of the schema
        pre, post = tr.head_state(tr.document(before)), tr.head_state(tr.document(after))
        if not result.ok:
            assert after == before  # a failed guard changes nothing
        else:
            # every applied change is an edge of the table, from the state it met
            assert tr.allowed(pre, decided.transition) == post, (pre, decided.transition, post)
            if decided.transition == "retire":  # history holds the record exactly as it was
                entry = dict(after["history"][_name(before["allocation"])])
                assert entry.pop("final_state") == inputs["final_state"]
                assert entry.pop("ended_at") is not None
                assert Allocation.model_validate(entry) == Allocation.model_validate(
                    before["allocation"])
            if before.get("closed_at") is not None:
                assert not (pre is tr.HeadState.ABSENT and post is tr.HeadState.SUBMITTING)
        if post is tr.HeadState.UNRECOGNIZED:  # only ever one the initial document had
            assert pre is tr.HeadState.UNRECOGNIZED
        _check_records(before, after, seen, result.ok and decided.transition)
        history_of_reads.append(after)


def _check_records(before: dict[str, Any], after: dict[str, Any], seen: set[str],
                   applied: str | bool) -> None:
    """No head or successor record lost or both live and retired; a promotion moved the
    successor to the head and the predecessor to the history as REPLACED."""
    live = {_identity(after.get("allocation")), _identity(after.get("successor"))} - {None}
    seen |= live
    retired = [_identity(entry) for entry in (after.get("history") or {}).values()]
    assert seen <= set(retired) | live, "a head or successor record was lost"
    assert not live & set(retired), "one record both live and retired"
    assert len(retired) == len(set(retired)), "a record retired twice"
    if applied == "promote_successor":
        assert after["allocation"]["token"] == before["successor"]["token"]
        assert after.get("successor") is None
        if before.get("allocation") is not None:
            assert after["history"][_name(before["allocation"])]["final_state"] == "REPLACED"


def test_the_design_document_lists_every_edge() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "design.md").read_text()

    def name(state: Any) -> str:
        return state.value.upper() if isinstance(state, tr.HeadState) else "any (kept)"

    for edge in tr.TRANSITIONS:
        assert f"| {name(edge.source)} | `{edge.name}` | {name(edge.target)} | {edge.why} |" in text
