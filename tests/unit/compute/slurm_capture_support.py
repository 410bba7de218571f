"""Slurm-mode ``compute.run`` calls without a cluster: the asset-scope runner records what
it was asked to run, and the connection fails any use."""

from typing import Any

import pytest

from dagster_slurm import SSHConnectionResource
from dagster_slurm.compute.slurm_runner import SlurmRunner


class NoCluster:
    """A connection that was never opened: closing it is fine, using it fails the test."""

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the cluster was contacted ({name})")


def capture_slurm_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[SlurmRunner, Any]]:
    """``(runner, request)`` of each call that reaches the asset-scope Slurm runner, which
    then returns None instead of submitting."""
    calls: list[tuple[SlurmRunner, Any]] = []
    monkeypatch.setattr(SlurmRunner, "run",
                        lambda self, context, request: calls.append((self, request)))
    monkeypatch.setattr(SSHConnectionResource, "get_transport", lambda self: NoCluster())
    return calls
