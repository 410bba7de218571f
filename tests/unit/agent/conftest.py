from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dagster_slurm.agent.bundle import default_program
from dagster_slurm.agent.client import AgentClient
from dagster_slurm.transport.local import LocalTransport


@pytest.fixture(scope="session")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent archive of this checkout, written to a file."""
    path = tmp_path_factory.mktemp("program") / f"{default_program().name}.zip"
    path.write_bytes(default_program().data)
    return path


@pytest.fixture
def transport() -> LocalTransport:
    return LocalTransport(default_timeout=60)


@pytest.fixture
def client(tmp_path: Path, transport: LocalTransport) -> AgentClient:
    return AgentClient(transport, str(tmp_path / "base"), python=sys.executable)


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory of fake Slurm commands, first on the PATH the agent inherits."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ['PATH']}")
    return path
