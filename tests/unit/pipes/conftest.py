from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.pipes.sources import AgentFileSource, FileSource, LocalFileSource
from dagster_slurm.transport.local import LocalTransport


@pytest.fixture
def agent_client(tmp_path: Path) -> AgentClient:
    """A client of the real agent program, run locally (no SSH)."""
    return AgentClient(LocalTransport(default_timeout=60), str(tmp_path / "base"), sys.executable)


@pytest.fixture(params=["agent", "local"])
def source(request: pytest.FixtureRequest, agent_client: AgentClient) -> FileSource:
    """Each file source in turn: the real agent's tail op, and direct local reads."""
    if request.param == "agent":
        return AgentFileSource(agent_client)
    return LocalFileSource()
