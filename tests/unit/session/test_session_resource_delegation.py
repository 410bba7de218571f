"""SlurmSessionResource's session operations take the RunSession methods' parameters.

Every operation the resource offers on the context's run session has, after ``context``,
exactly the parameters of the ``RunSession`` method it calls (names, kinds, defaults),
without ``logger`` (the resource passes ``context.log``), so a parameter added to the session
appears on the resource, and no default is written twice.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from dagster_slurm.session.frontend.resource import SlurmSessionResource
from dagster_slurm.session.session import RunSession

DELEGATED = {
    "replace_head": "replace_head",
    "submit_successor": "submit_successor",
    "promote_successor": "promote_successor",
    "inspect": "inspect",
    "reconcile_workers": "reconcile_workers",
    "assign_worker_intent": "assign_worker_intent",
    "add_worker_allocation": "add_worker_allocation",
    "wait_for_worker_allocation": "wait_for_worker_allocation",
    "remove_worker_allocation": "remove_worker_allocation",
    "worker_allocations": "list_worker_allocations",
    "worker_sbatch_options": "worker_sbatch_options",
    "estimate_worker_starts": "estimate_worker_starts",
}


@pytest.mark.parametrize(("resource_name", "session_name"), sorted(DELEGATED.items()))
def test_the_resource_takes_the_session_methods_parameters(resource_name: str,
                                                           session_name: str) -> None:
    session = inspect.signature(getattr(RunSession, session_name))
    resource = inspect.signature(getattr(SlurmSessionResource, resource_name))
    expected = [p for p in session.parameters.values() if p.name not in ("self", "logger")]
    assert list(resource.parameters)[:2] == ["self", "context"]
    assert list(resource.parameters.values())[2:] == expected
    assert resource.return_annotation == session.return_annotation


class _Session:
    """Records the call the resource makes on the run's session."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> str:
            self.calls.append((name, args, kwargs))
            return "done"
        return call


def test_arguments_and_the_context_log_reach_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    session = _Session()
    monkeypatch.setattr(SlurmSessionResource, "get_session", lambda self, context: session)
    context = SimpleNamespace(log="the-log")
    resource = SlurmSessionResource.model_construct()
    assert resource.remove_worker_allocation(context, "7", 30.0, wait=False) == "done"
    assert resource.inspect(context) == "done"
    assert resource.worker_allocations(context) == "done"
    assert session.calls == [
        ("remove_worker_allocation", ("7", 30.0), {"wait": False, "logger": "the-log"}),
        ("inspect", (), {}),
        ("list_worker_allocations", (), {}),
    ]
