"""The patch language: pointers, every operation, all-or-nothing, conflicts vs errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagster_slurm.agent.remote.patch import (
    PatchConflict,
    PatchError,
    apply_patch,
    get_path,
    json_equal,
    make_pointer,
    parse_pointer,
)

DOC: dict[str, Any] = {
    "workers": {"123": {"drain_deadline": None, "nodes": ["a", "b"]}},
    "a/b": {"m~n": 1},
    "n": 5,
    "flag": True,
}


def test_pointer_escapes_round_trip() -> None:
    assert make_pointer("a/b", "m~n") == "/a~1b/m~0n"
    assert parse_pointer("/a~1b/m~0n") == ["a/b", "m~n"]
    assert parse_pointer("/~01") == ["~1"]  # ~0 is decoded after ~1
    assert parse_pointer("") == []
    assert get_path(DOC, "/a~1b/m~0n") == 1
    with pytest.raises(ValueError):
        parse_pointer("workers")


@given(st.lists(st.text(), max_size=4))
def test_make_and_parse_pointer_are_inverse(tokens: list[str]) -> None:
    assert parse_pointer(make_pointer(*tokens)) == tokens


def test_add_replace_remove_and_append() -> None:
    patch = [
        {"op": "add", "path": "/workers/123/drain_deadline", "value": 10.5},
        {"op": "add", "path": "/workers/123/nodes/-", "value": "c"},
        {"op": "add", "path": "/workers/123/nodes/0", "value": "z"},
        {"op": "replace", "path": "/n", "value": 6},
        {"op": "remove", "path": "/flag"},
    ]
    out = apply_patch(DOC, patch)
    assert out["workers"]["123"] == {"drain_deadline": 10.5, "nodes": ["z", "a", "b", "c"]}
    assert out["n"] == 6 and "flag" not in out


def test_input_is_never_mutated_and_values_are_copied() -> None:
    before = copy.deepcopy(DOC)
    value = {"k": [1]}
    out = apply_patch(DOC, [{"op": "add", "path": "/x", "value": value}])
    value["k"].append(2)
    assert DOC == before
    assert out["x"] == {"k": [1]}


def test_incr_setdefault_max() -> None:
    patch = [
        {"op": "incr", "path": "/n", "value": 2},
        {"op": "incr", "path": "/fresh", "value": 3},
        {"op": "setdefault", "path": "/n", "value": 100},
        {"op": "setdefault", "path": "/leases", "value": {}},
        {"op": "max", "path": "/n", "value": 4},
        {"op": "max", "path": "/top", "value": 9},
        {"op": "max", "path": "/top", "value": 11},
    ]
    out = apply_patch(DOC, patch)
    assert (out["n"], out["fresh"], out["leases"], out["top"]) == (7, 3, {}, 11)


def test_value_now_uses_the_given_clock() -> None:
    out = apply_patch({}, [{"op": "add", "path": "/t", "value_now": 30}], now=1000.0)
    assert out == {"t": 1030.0}
    with pytest.raises(PatchError, match="clock"):
        apply_patch({}, [{"op": "add", "path": "/t", "value_now": 30}])


def test_failed_test_is_a_conflict_with_details() -> None:
    patch = [
        {"op": "replace", "path": "/n", "value": 1},
        {"op": "test", "path": "/workers/123/nodes/1", "value": "x"},
    ]
    with pytest.raises(PatchConflict) as info:
        apply_patch(DOC, patch)
    conflict = info.value.to_dict()
    assert conflict["index"] == 1 and conflict["path"] == "/workers/123/nodes/1"
    assert conflict["exists"] is True and conflict["actual"] == "b"


def test_absent_and_missing_test_are_conflicts() -> None:
    with pytest.raises(PatchConflict) as info:
        apply_patch(DOC, [{"op": "absent", "path": "/n"}])
    assert info.value.to_dict()["actual"] == 5
    with pytest.raises(PatchConflict) as info:
        apply_patch(DOC, [{"op": "test", "path": "/nope", "value": 1}])
    assert info.value.to_dict()["exists"] is False
    assert apply_patch(DOC, [{"op": "absent", "path": "/nope"}]) == DOC


def test_absent_accepts_null_as_an_empty_record() -> None:
    doc = {"allocation": None, "successor": {"job_id": "7"}}
    assert apply_patch(doc, [{"op": "absent", "path": "/allocation"}]) == doc
    with pytest.raises(PatchConflict):
        apply_patch(doc, [{"op": "absent", "path": "/successor"}])


def test_json_equality_does_not_confuse_booleans_and_numbers() -> None:
    assert not json_equal(True, 1) and not json_equal(0, False) and json_equal(1, 1.0)
    with pytest.raises(PatchConflict):
        apply_patch(DOC, [{"op": "test", "path": "/flag", "value": 1}])
    apply_patch(DOC, [{"op": "test", "path": "/flag", "value": True}])


@pytest.mark.parametrize(
    ("cmp", "value", "holds"),
    [("lt", 6, True), ("lt", 5, False), ("le", 5, True), ("gt", 4, True), ("ge", 6, False)]
    + [("ne", 5, False), ("ne", 4, True), ("eq", 5, True)],
)
def test_comparisons(cmp: str, value: int, holds: bool) -> None:
    patch = [{"op": "test", "path": "/n", "cmp": cmp, "value": value}]
    if holds:
        apply_patch(DOC, patch)
    else:
        with pytest.raises(PatchConflict):
            apply_patch(DOC, patch)


def test_ordering_a_non_number_is_a_conflict() -> None:
    with pytest.raises(PatchConflict, match="cannot be ordered"):
        apply_patch(DOC, [{"op": "test", "path": "/workers", "cmp": "lt", "value": 1}])


@pytest.mark.parametrize(
    "op",
    [
        {"op": "add", "path": "/missing/child", "value": 1},
        {"op": "replace", "path": "/missing", "value": 1},
        {"op": "remove", "path": "/missing"},
        {"op": "add", "path": "/workers/123/nodes/7", "value": 1},
        {"op": "add", "path": "/workers/123/nodes/01", "value": 1},
        {"op": "incr", "path": "/workers", "value": 1},
        {"op": "incr", "path": "/n", "value": "1"},
        {"op": "add", "path": "/n/x", "value": 1},
        {"op": "add", "path": "n", "value": 1},
        {"op": "add", "path": "/x"},
        {"op": "move", "path": "/n"},
        {"op": "test", "path": "/n", "cmp": "approx", "value": 1},
        {"op": "remove", "path": ""},
        "not an op",
    ],
)
def test_structural_problems_are_errors_not_conflicts(op: Any) -> None:
    with pytest.raises(PatchError) as info:
        apply_patch(DOC, [{"op": "incr", "path": "/n", "value": 1}, op])
    assert not isinstance(info.value, PatchConflict)
    assert info.value.index == 1


def test_remove_missing_ok() -> None:
    assert apply_patch(DOC, [{"op": "remove", "path": "/nope", "missing_ok": True}]) == DOC


def test_root_replace() -> None:
    assert apply_patch(DOC, [{"op": "replace", "path": "", "value": {"a": 1}}]) == {"a": 1}
