"""Shared code of the agent tests: run the real agent program as a local subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

PYTHON = sys.executable
#: An old interpreter to prove the program runs on the oldest supported Python (if present).
PYTHON38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"
SRC = str(Path(__file__).resolve().parents[3] / "src")


def run_program(
    program: Path,
    request: Any = None,
    *,
    raw: bytes | None = None,
    python: str = PYTHON,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, Any]]:
    """Run the agent archive like the client does; returns (exit code, decoded stdout)."""
    data = raw if raw is not None else json.dumps(request).encode()
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [python, "-I", "-S", str(program)],
        input=data,
        capture_output=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


def ops(*items: dict[str, Any]) -> dict[str, Any]:
    """A protocol-1 request with these ops."""
    return {"protocol": 1, "ops": list(items)}


def start_lock_holder(lock: Path, purpose: str = "test holder") -> subprocess.Popen[str]:
    """A separate process that takes ``lock`` with the module's lock function and sleeps."""
    code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {SRC!r})
        from dagster_slurm.agent.remote.lock import acquire
        acquire({str(lock)!r}, timeout=10, purpose={purpose!r})
        print("locked", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


def write_script(directory: Path, name: str, body: str) -> Path:
    """An executable shell script ``directory/name``."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
