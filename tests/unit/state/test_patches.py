"""The session document's patch builder: its shapes, guards and checks, and that the state
package writes its operations only there and shares no private helper between modules."""

from __future__ import annotations

import ast
from enum import Enum
from pathlib import Path

from dagster_slurm.state import lease
from dagster_slurm.state import patches as pt
from dagster_slurm.state.schema import SessionDocument

STATE = Path(pt.__file__).resolve().parent


def _trees() -> dict[str, ast.AST]:
    return {path.name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for path in sorted(STATE.glob("*.py"))}


def test_no_state_module_imports_a_private_name_of_another() -> None:
    found = []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            ours = isinstance(node, ast.ImportFrom) and (
                node.level > 0 or (node.module or "").startswith("dagster_slurm."))
            if ours:
                found += [f"{name}:{node.lineno} {alias.name}" for alias in node.names
                          if alias.name.startswith("_")]
    assert not found


def test_only_the_builder_writes_operation_dicts() -> None:
    found = []
    for name, tree in _trees().items():
        if name == "patches.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and any(
                    isinstance(key, ast.Constant) and key.value == "op" for key in node.keys):
                found.append(f"{name}:{node.lineno}")
    assert not found


def test_shapes_keep_the_documented_key_order() -> None:
    assert list(pt.add_now("/a", 5)) == ["op", "path", "value_now"]
    assert pt.compare_now("/a/expires_at", "le") == {
        "op": "test", "path": "/a/expires_at", "cmp": "le", "value_now": 0}
    assert pt.as_read("/w/released", None) == pt.absent("/w/released")
    assert pt.as_read("/w/released", False) == pt.equals("/w/released", False)
    assert pt.submitting_guards("/s", None) == (pt.equals("/s/status", "submitting"),)
    assert pt.submitting_guards("/s", "t")[0] == pt.equals("/s/token", "t")


def test_to_history_only_claims_a_free_name_when_exclusive() -> None:
    shared = pt.to_history("12", {"job_id": "12"})
    exclusive = pt.to_history("12", {"job_id": "12"}, exclusive=True)
    assert exclusive == (shared[0], pt.absent("/history/12"), *shared[1:])
    assert shared[-1] == pt.add_now("/history/12/ended_at")


class _Light(str, Enum):
    OFF = "off"
    ON = "on"


EDGES = (pt.Edge(_Light.OFF, "switch_on", _Light.ON, "on"),
         pt.Edge(pt.ANY, "look", pt.ANY, "any state"))


def test_check_edge_allows_table_edges_and_names_the_sources_otherwise() -> None:
    assert pt.check_edge(EDGES, _Light.OFF, "switch_on", "the light") is None
    assert pt.check_edge(EDGES, _Light.ON, "look", "the light") is None
    refused = pt.check_edge(EDGES, _Light.ON, "switch_on", "the light")
    assert refused == pt.Refused("switch_on", "the light is on; switch_on applies only when "
                                              "it is off")
    told = pt.check_edge(EDGES, _Light.ON, "switch_on", "the light", "on (since noon)")
    assert told is not None and "the light is on (since noon);" in told.reason


def test_check_owned_names_the_record_and_what_it_is_now() -> None:
    doc = SessionDocument(job_name="j", allocation={"job_id": "11", "status": "submitted"},
                          successor={"token": "s", "status": "submitting"})
    assert pt.check_owned(None, "x", "job_id", "12") is None
    assert pt.check_owned(doc, "x", "job_id", "11") is None
    head = pt.check_owned(doc, "x", "job_id", "12")
    assert head is not None and head.reason == (
        "the head allocation is no longer the one with job_id '12' (now job_id '11')")
    successor = pt.check_owned(doc, "x", "token", "t", record="successor")
    assert successor is not None and successor.reason.startswith("the successor is no longer")


def test_lease_takeover_is_guarded_by_the_record_as_read_and_its_expiry() -> None:
    previous = {"owner": "a", "expires_at": 5.0}
    assert lease.take_guards("/election", None, takeover=False) == [pt.absent("/election")]
    assert lease.take_guards("/election", previous, takeover=True) == [
        pt.equals("/election", previous), lease.expired_guard("/election")]
    assert lease.has_expired(None, 0.0) and lease.has_expired(5.0, 5.0)
    assert not lease.has_expired(5.0, 4.9)
