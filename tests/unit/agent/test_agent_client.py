"""AgentClient: install once per program version, one round trip per request, typed errors."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from dagster_slurm.agent.bundle import AgentProgram, build_program
from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import AgentOpError, AgentProtocolError, OpSkipped
from dagster_slurm.agent.ops import exec_op, read_op, txn_op
from dagster_slurm.errors import ConfigurationError, DagsterSlurmError
from dagster_slurm.transport.base import CommandResult, TransportStats
from dagster_slurm.transport.local import LocalTransport

REMOTE_DIR = Path(__file__).resolve().parents[3] / "src/dagster_slurm/agent/remote"


def test_installs_once_then_one_round_trip_per_call(
    client: AgentClient, transport: LocalTransport, tmp_path: Path
) -> None:
    assert client.run(exec_op(["echo", "a"])).stdout == "a\n"
    assert transport.stats.round_trips == 3  # not installed (97), install, retry
    installed = Path(client.program_path)
    assert installed == tmp_path / "base" / ".dagster-slurm" / client.program.name
    assert (installed / "__main__.py").is_file()
    transport.stats.reset()
    for _ in range(3):
        client.run(exec_op(["true"]))
    assert transport.stats.round_trips == 3
    # the login node's python caches the compiled agent next to it
    assert list((installed / "dagster_slurm_agent" / "__pycache__").glob("*.pyc"))


def test_a_new_program_version_installs_under_its_own_hash(
    tmp_path: Path, transport: LocalTransport
) -> None:
    changed = tmp_path / "remote"
    shutil.copytree(REMOTE_DIR, changed, ignore=shutil.ignore_patterns("__pycache__"))
    with (changed / "common.py").open("a") as f:
        f.write("\n# a later library version\n")
    base = str(tmp_path / "base")
    old = AgentClient(transport, base, python=sys.executable)
    new = AgentClient(transport, base, python=sys.executable, program=build_program(changed))
    assert old.program_path != new.program_path
    old.run(exec_op(["true"]))
    new.run(exec_op(["true"]))
    assert Path(old.program_path).is_dir() and Path(new.program_path).is_dir()


def test_removed_program_is_reinstalled_via_exit_97(
    client: AgentClient, transport: LocalTransport
) -> None:
    client.run(exec_op(["true"]))
    shutil.rmtree(client.program_path)
    transport.stats.reset()
    assert client.run(exec_op(["echo", "back"])).stdout == "back\n"
    assert transport.stats.round_trips == 3


def test_install_refuses_an_archive_that_does_not_match_its_hash(
    tmp_path: Path, transport: LocalTransport
) -> None:
    good = build_program()
    bad = AgentProgram(good.data[:-10], good.sha256)
    client = AgentClient(transport, str(tmp_path), python=sys.executable, program=bad)
    with pytest.raises(AgentProtocolError, match="does not match its hash"):
        client.run(exec_op(["true"]))
    assert not Path(client.program_path).exists()


def test_missing_python_is_a_clear_error(client: AgentClient, transport: LocalTransport) -> None:
    client.run(exec_op(["true"]))
    broken = AgentClient(transport, str(Path(client.install_dir).parent), python="no-such-python3")
    with pytest.raises(AgentProtocolError, match="no-such-python3") as info:
        broken.run(exec_op(["true"]))
    assert info.value.result is not None and info.value.result.exit_code == 127


def test_base_path_must_not_rely_on_tilde(transport: LocalTransport) -> None:
    with pytest.raises(ConfigurationError):
        AgentClient(transport, "~/dagster")


def test_batch_is_one_round_trip_with_requires(
    client: AgentClient, transport: LocalTransport, tmp_path: Path
) -> None:
    client.run(exec_op(["true"]))
    transport.stats.reset()
    doc, lock = str(tmp_path / "d.json"), str(tmp_path / "lock")
    with client.batch() as batch:
        saved = batch.add(txn_op(doc, lock, [{"op": "add", "path": "/a", "value": 1}], create={}))
        after = batch.add(exec_op(["cat", doc]), requires=[saved])
        stale = batch.add(txn_op(doc, lock, [{"op": "test", "path": "/a", "value": 2}]))
        skipped = batch.add(exec_op(["echo", "never"]), requires=[saved, stale])
    assert transport.stats.round_trips == 1
    assert saved.result().version == 1
    assert json.loads(after.result().stdout)["a"] == 1
    conflict = stale.result()
    assert not conflict.ok and conflict.conflict is not None and not stale.ok
    with pytest.raises(OpSkipped):
        skipped.result()


def test_batch_checks_its_use(client: AgentClient) -> None:
    first, second = client.batch(), client.batch()
    pending = first.add(exec_op(["true"]))
    with pytest.raises(ValueError):
        second.add(exec_op(["true"]), requires=[pending])
    with pytest.raises(RuntimeError):
        pending.result()
    assert second.run() is None  # empty: no round trip


def test_agent_warnings_are_logged(
    client: AgentClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock = tmp_path / "lock"
    lock.mkdir()
    (lock / "owner.json").write_text(json.dumps({"host": socket.gethostname(), "pid": 999_999_999}))
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.agent"):
        result = client.run(txn_op(str(tmp_path / "d.json"), str(lock), [], create={}))
    assert result.warnings and "broke stale lock" in caplog.text


class CannedTransport:
    """Returns one fixed command result, to exercise answer decoding."""

    def __init__(self, exit_code: int, stdout: str, stderr: str = "") -> None:
        self.stats = TransportStats()
        self.result = CommandResult("agent", exit_code, stdout, stderr, 0.0)

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        self.stats.record(argv[0], 0, 0)
        return self.result

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("exit_code", "stdout", "needle"),
    [
        (2, '{"protocol": 1, "error": {"type": "BadRequest", "message": "nope"}}', "nope"),
        (1, "Traceback (most recent call last): ...", "without a readable answer"),
        (0, '{"protocol": 1, "results": [], "now": 1}', "0 results for 1 ops"),
        (3, '{"protocol": 1, "results": [{"ok": true}], "now": 1}', "exit 3"),
    ],
)
def test_unreadable_or_rejected_answers(exit_code: int, stdout: str, needle: str) -> None:
    client = AgentClient(CannedTransport(exit_code, stdout), "/base")
    with pytest.raises(AgentProtocolError, match=needle) as info:
        client.run(read_op("/x"))
    assert isinstance(info.value, DagsterSlurmError) and info.value.result is not None


def test_op_errors_carry_type_message_and_details() -> None:
    answer = {"ok": False, "error": {"type": "ExecError", "message": "boom"}, "rc": None}
    client = AgentClient(CannedTransport(0, json.dumps({"results": [answer], "now": 1})), "/b")
    with pytest.raises(AgentOpError) as info:
        client.run(exec_op(["x"]))
    assert (info.value.type, info.value.message, info.value.index) == ("ExecError", "boom", 0)
    assert info.value.details == {"rc": None}
