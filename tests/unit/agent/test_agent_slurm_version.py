"""The Slurm release is learnt in the first request's round trip (``hello``), once."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
from agent_support import run_program, write_script

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import exec_op
from dagster_slurm.slurm.version import SlurmVersion
from dagster_slurm.transport.local import LocalTransport


def _fake_squeue(bindir: Path, calls: Path, line: str = "slurm 24.11.5") -> None:
    write_script(bindir, "squeue", f"""\
        echo "squeue $*" >> {calls}
        [ "$1" = --version ] && echo '{line}'
        exit 0
        """)


def test_a_request_with_hello_gets_the_first_line_of_squeue_version(
        program: Path, bindir: Path, tmp_path: Path) -> None:
    _fake_squeue(bindir, tmp_path / "calls", "slurm-wlm 24.11.5")
    code, response = run_program(program, {"protocol": 1, "ops": [], "hello": True},
                                 env={"PATH": os.environ["PATH"]})
    assert code == 0 and response["slurm_version"] == {"text": "slurm-wlm 24.11.5"}
    code, response = run_program(program, {"protocol": 1, "ops": []},
                                 env={"PATH": os.environ["PATH"]})
    assert "slurm_version" not in response
    assert (tmp_path / "calls").read_text() == "squeue --version\n"


def test_without_squeue_the_answer_says_why(program: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, response = run_program(program, {"protocol": 1, "ops": [], "hello": True},
                                 env={"PATH": str(empty)})
    assert code == 0 and response["slurm_version"]["text"] is None
    assert "squeue" in response["slurm_version"]["error"]


def test_the_client_learns_the_release_in_its_first_round_trip_and_logs_it(
        bindir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls = tmp_path / "calls"
    _fake_squeue(bindir, calls)
    transport = LocalTransport(default_timeout=60)
    client = AgentClient(transport, str(tmp_path / "base"), python=sys.executable,
                         where="alice@login:22", learn_slurm_version=True)
    assert client.slurm_version is None
    with caplog.at_level(logging.INFO, logger="dagster_slurm.agent"):
        assert client.run(exec_op(["echo", "a"])).stdout == "a\n"
    assert transport.stats.round_trips == 3  # not installed, install, the request: no extra
    assert client.slurm_version == SlurmVersion(24, 11, 5)
    assert client.slurm_version_text == "slurm 24.11.5"
    assert "Slurm 24.11.5 at alice@login:22" in caplog.messages
    transport.stats.reset()
    for _ in range(3):
        client.run(exec_op(["true"]))
    assert transport.stats.round_trips == 3
    assert calls.read_text() == "squeue --version\n", "asked once per connection"


def test_a_client_not_asked_to_learn_it_never_runs_squeue(
        client: AgentClient, bindir: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    _fake_squeue(bindir, calls)
    client.run(exec_op(["true"]))
    assert client.slurm_version is None and not calls.exists()


def test_an_unreadable_answer_leaves_the_release_unknown_with_a_warning(
        bindir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _fake_squeue(bindir, tmp_path / "calls", "something else")
    client = AgentClient(LocalTransport(default_timeout=60), str(tmp_path / "base"),
                         python=sys.executable, learn_slurm_version=True)
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.agent"):
        client.run(exec_op(["true"]))
    assert client.slurm_version is None and client.slurm_version_text == "something else"
    assert any("22.05" in message for message in caplog.messages)
