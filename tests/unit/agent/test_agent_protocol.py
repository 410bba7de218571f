"""The request/response envelope of the real agent program, run as a subprocess."""

from __future__ import annotations

import ast
import base64
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agent_support import PYTHON, PYTHON38, SRC, ops, run_program

from dagster_slurm.agent.bundle import build_program, default_program

REMOTE_DIR = Path(__file__).resolve().parents[3] / "src/dagster_slurm/agent/remote"


def test_response_carries_results_in_order_and_the_clock(program: Path) -> None:
    before = time.time()
    rc, out = run_program(
        program,
        ops({"op": "exec", "argv": ["echo", "one"]}, {"op": "exec", "argv": ["echo", "two"]}),
    )
    assert rc == 0 and out["protocol"] == 1
    assert [r["stdout"] for r in out["results"]] == ["one\n", "two\n"]
    assert all(r["ok"] for r in out["results"])
    assert before <= out["now"] <= time.time()


def test_requires_skips_dependents_of_failed_ops(program: Path) -> None:
    rc, out = run_program(
        program,
        ops(
            {"op": "exec", "argv": ["true"]},
            {"op": "exec", "argv": ["false"], "check": True},
            {"op": "exec", "argv": ["echo", "runs"], "requires": [0]},
            {"op": "exec", "argv": ["echo", "skipped"], "requires": [0, 1]},
            {"op": "exec", "argv": ["echo", "also skipped"], "requires": [3]},
        ),
    )
    results = out["results"]
    assert rc == 0
    assert results[1]["error"]["type"] == "CommandFailed" and results[1]["rc"] == 1
    assert results[2]["ok"] and results[2]["stdout"] == "runs\n"
    assert results[3]["skipped"] is True and not results[3]["ok"]
    assert results[3]["error"]["type"] == "Skipped"
    assert results[4]["skipped"] is True


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"protocol": 2, "ops": []}', "unsupported protocol"),
        (b'{"ops": []}', "unsupported protocol"),
        (b'{"protocol": 1, "ops": {}}', "'ops' must be a list"),
        (b"", "not valid JSON"),
    ],
)
def test_malformed_requests_get_a_top_level_error(program: Path, raw: bytes, needle: str) -> None:
    rc, out = run_program(program, raw=raw)
    assert rc == 2
    assert out["error"]["type"] == "BadRequest" and needle in out["error"]["message"]
    assert "results" not in out


def test_bad_ops_fail_alone(program: Path) -> None:
    rc, out = run_program(
        program,
        ops(
            "just a string",
            {"op": "teleport"},
            {"op": "exec"},
            {"op": "exec", "argv": ["true"], "requires": [5]},
            {"op": "exec", "argv": ["true"], "requires": [True]},
            {"op": "exec", "argv": ["/nonexistent/binary"]},
            {"op": "tail", "files": [{"path": "/x", "max_bytes": -1}]},
            {"op": "exec", "argv": ["echo", "still fine"]},
        ),
    )
    types = [r.get("error", {}).get("type") for r in out["results"]]
    assert rc == 0
    assert types == [
        "BadRequest",
        "UnknownOp",
        "BadRequest",
        "BadRequest",
        "BadRequest",
        "ExecError",
        "BadRequest",
        None,
    ]
    assert out["results"][-1]["stdout"] == "still fine\n"


def _ended(pid: int) -> bool:
    """Process ``pid`` is gone or a zombie (an orphan nobody reaps here)."""
    try:
        record = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return record.rsplit(")", 1)[1].split()[0] == "Z"


def test_exec_timeout_kills_the_process_group(program: Path, tmp_path: Path) -> None:
    marker, child = tmp_path / "child-survived", tmp_path / "child.pid"
    # the child (a subshell in the command's process group) would touch the marker in 2 s
    script = f"(sleep 2; touch {marker}) & echo $! > {child}; sleep 30"
    start = time.monotonic()
    rc, out = run_program(
        program, ops({"op": "exec", "argv": ["sh", "-c", script], "timeout": 0.5})
    )
    assert time.monotonic() - start < 10
    result = out["results"][0]
    assert result["error"]["type"] == "CommandTimeout" and result["rc"] is None
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while not _ended(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _ended(pid) and not marker.exists()  # it ended without touching the marker


def test_exec_passes_stdin_env_and_cwd_without_a_shell(program: Path, tmp_path: Path) -> None:
    rc, out = run_program(
        program,
        ops(
            {"op": "exec", "argv": ["cat"], "stdin": "héllo $HOME"},
            {
                "op": "exec",
                "argv": ["sh", "-c", 'echo "$X"; pwd'],
                "env": {"X": "a b;c"},
                "cwd": str(tmp_path),
            },
            {"op": "exec", "argv": ["cat"], "stdin_b64": "AP8="},
        ),
    )
    first, second, third = out["results"]
    assert first["stdout"] == "héllo $HOME"
    assert second["stdout"] == f"a b;c\n{tmp_path}\n"
    assert third["stdout"] == "\x00\ufffd"


@pytest.mark.skipif(not os.path.exists(PYTHON38), reason="no python3.8 interpreter here")
def test_program_runs_on_python38(program: Path, tmp_path: Path) -> None:
    doc = tmp_path / "d.json"
    rc, out = run_program(
        program,
        ops(
            {
                "op": "txn",
                "path": str(doc),
                "lock": str(tmp_path / "lock"),
                "create": {},
                "patch": [{"op": "incr", "path": "/n", "value": 1}],
            },
            {"op": "tail", "files": [{"path": str(doc)}]},
        ),
        python=PYTHON38,
    )
    assert rc == 0 and all(r["ok"] for r in out["results"]), out


def test_archive_is_reproducible_and_named_by_its_hash(tmp_path: Path) -> None:
    assert build_program() == build_program() == default_program()
    changed = tmp_path / "remote"
    changed.mkdir()
    for source in REMOTE_DIR.glob("*.py"):
        (changed / source.name).write_bytes(source.read_bytes())
    (changed / "protocol.py").write_text((REMOTE_DIR / "protocol.py").read_text() + "\n# new\n")
    assert build_program(changed).name != default_program().name


def test_agent_package_uses_only_the_standard_library() -> None:
    for source in REMOTE_DIR.glob("*.py"):
        tree = ast.parse(source.read_text(), feature_version=(3, 8))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top == "__future__" or top in sys.stdlib_module_names, (source, name)


_HOLDER = """
import io, json, sys, time
sys.path.insert(0, {src!r})
from dagster_slurm.agent.remote import protocol
from dagster_slurm.agent.remote.lock import locked

def hold(params, ctx):
    with locked(params["lock"], 5, "hold", ctx.warnings):
        print("held", file=sys.stderr, flush=True)
        time.sleep(60)
    return {{}}

protocol.HANDLERS["hold"] = hold
request = json.dumps({{"protocol": 1, "ops": [{{"op": "hold", "lock": {lock!r}}}]}})
sys.exit(protocol.main(io.BytesIO(request.encode()), sys.stdout.buffer))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_termination_signals_release_a_held_lock(tmp_path: Path, signum: int) -> None:
    lock = tmp_path / "lock"
    code = textwrap.dedent(_HOLDER.format(src=SRC, lock=str(lock)))
    proc = subprocess.Popen([PYTHON, "-c", code], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None and proc.stderr.readline() == "held\n"
    assert lock.is_dir()
    proc.send_signal(signum)
    assert proc.wait(timeout=10) == 128 + signum
    assert not lock.exists()


def test_a_negative_tail_offset_reads_the_end_of_the_file(program: Path, tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_bytes(b"first line\nlast line\n")
    rc, out = run_program(program, ops(
        {"op": "tail", "files": [{"path": str(log), "offset": -10},
                                 {"path": str(log), "offset": -1000}]}))
    assert rc == 0
    near_end, whole = out["results"][0]["files"]
    assert base64.b64decode(near_end["data"]) == b"last line\n"
    assert near_end["offset"] == 21  # where a next read starts
    assert base64.b64decode(whole["data"]) == b"first line\nlast line\n"
