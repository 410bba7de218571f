"""The deferred context injector: no I/O, the payload bytes for the submission batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from dagster_pipes import PipesContextData, PipesDefaultContextLoader

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import exec_op
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector

CONTEXT = cast(
    PipesContextData,
    {"asset_keys": ["a/b"], "run_id": "r1", "extras": {"date": "2024-05-01", "n": 3}},
)


def test_inject_context_only_serialises_and_yields_the_file_path(tmp_path: Path) -> None:
    path = tmp_path / "job" / "context.json"
    seen: list[bytes] = []
    injector = PipesDeferredFileContextInjector(str(path), on_payload=seen.append)
    assert not injector.injected
    with pytest.raises(RuntimeError, match="open_pipes_session"):
        _ = injector.payload
    with injector.inject_context(CONTEXT) as params:
        assert params == {PipesDefaultContextLoader.FILE_PATH_KEY: str(path)}
        assert json.loads(injector.payload) == CONTEXT
        assert seen == [injector.payload]
        assert not path.exists() and not path.parent.exists()  # writing is the caller's job
    assert not path.parent.exists()


def test_the_default_loader_reads_the_file_written_from_the_payload(tmp_path: Path) -> None:
    path = tmp_path / "context.json"
    injector = PipesDeferredFileContextInjector(str(path))
    with injector.inject_context(CONTEXT) as params:
        path.write_bytes(injector.payload)
        with PipesDefaultContextLoader().load_context(params) as loaded:
            assert loaded == CONTEXT


def test_write_op_goes_into_the_submission_batch_before_the_job(
    tmp_path: Path, agent_client: AgentClient
) -> None:
    path = tmp_path / "run" / "context.json"
    injector = PipesDeferredFileContextInjector(str(path))
    agent_client.run(exec_op(["true"]))  # installs the agent program
    stats: Any = agent_client.transport.stats
    before = stats.round_trips
    with injector.inject_context(CONTEXT):
        with agent_client.batch() as batch:
            written = batch.add(injector.write_op(makedirs=True))
            started = batch.add(exec_op(["cat", str(path)]), requires=[written])
    assert stats.round_trips - before == 1
    assert json.loads(started.result().stdout) == CONTEXT
    assert path.stat().st_mode & 0o777 == 0o600


def test_debug_text_names_the_expected_file() -> None:
    injector = PipesDeferredFileContextInjector("/scratch/me/run-1/context.json")
    assert "never serialised" in injector.no_messages_debug_text()
    with injector.inject_context(CONTEXT):
        text = injector.no_messages_debug_text()
    assert "/scratch/me/run-1/context.json" in text and "never" not in text


def test_rejects_an_empty_path() -> None:
    with pytest.raises(ValueError, match="path"):
        PipesDeferredFileContextInjector("")
