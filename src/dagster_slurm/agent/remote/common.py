"""Pieces shared by the agent's operations: the error type, parameter checks, subprocesses.

Stdlib only, Python 3.8+ (this module runs on the login node).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

#: Bytes of stdout/stderr kept per command (the tail is kept, where errors are printed).
DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024


class OpError(Exception):
    """An operation failed in a way the caller should see.

    ``type`` is a stable machine-readable name (``LockTimeout``, ``Conflict``, ``BadRequest``
    ...), ``message`` is for humans, and ``fields`` are merged into the operation's result
    (for example the current document of a failed transaction).
    """

    def __init__(self, type_: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message
        self.fields = fields


class OpContext:
    """Per-operation environment: clocks, sleep, and the warnings the result will carry.

    ``clock`` is wall time (epoch seconds, the login node's clock), ``monotonic`` measures
    durations, ``sleep`` waits; all three are injectable so timeouts are testable.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.warnings: list[str] = []


def bad_request(message: str) -> OpError:
    return OpError("BadRequest", message)


def get_str(params: dict, key: str, default: Any = ..., allow_empty: bool = False) -> Any:
    """``params[key]`` as a string; raises ``BadRequest`` when missing (and no default) or mistyped."""
    if key not in params or params[key] is None:
        if default is ...:
            raise bad_request(f"missing parameter {key!r}")
        return default
    value = params[key]
    if not isinstance(value, str) or (not allow_empty and not value):
        raise bad_request(f"parameter {key!r} must be a non-empty string")
    return value


def get_number(params: dict, key: str, default: Any = ..., minimum: float = 0.0) -> Any:
    """``params[key]`` as a number >= ``minimum``; booleans are rejected."""
    if key not in params or params[key] is None:
        if default is ...:
            raise bad_request(f"missing parameter {key!r}")
        return default
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise bad_request(f"parameter {key!r} must be a number >= {minimum}")
    return value


def get_argv(params: dict, key: str) -> list:
    """``params[key]`` as a non-empty list of strings."""
    argv = params.get(key)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise bad_request(f"parameter {key!r} must be a non-empty list of strings")
    return list(argv)


def get_env(params: dict, key: str = "env") -> dict:
    env = params.get(key) or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise bad_request(f"parameter {key!r} must map strings to strings")
    return env


def _decode_tail(data: bytes, limit: int) -> tuple:
    truncated = len(data) > limit
    if truncated:
        data = data[-limit:]
    return data.decode("utf-8", "replace"), truncated


def run_command(
    argv: list,
    stdin: bytes | None = None,
    timeout: float | None = None,
    env: dict | None = None,
    cwd: str | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
) -> dict:
    """Run ``argv`` without a shell in its own process group and collect its output.

    Returns ``rc``, ``stdout``, ``stderr`` (UTF-8, invalid bytes replaced; only the last
    ``max_output`` bytes of each, with ``stdout_truncated``/``stderr_truncated`` set when
    cut). On timeout the whole process group is killed and ``CommandTimeout`` is raised with
    the partial output; a program that cannot be started raises ``ExecError``.
    """
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise OpError("ExecError", f"could not run {argv[0]!r}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(stdin or b"", timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        result = _output(out, err, max_output)
        result["rc"] = None
        raise OpError(
            "CommandTimeout", f"{argv[0]!r} did not finish within {timeout:g} s", **result
        ) from None
    result = _output(out, err, max_output)
    result["rc"] = proc.returncode
    return result


def _output(out: bytes, err: bytes, max_output: int) -> dict:
    stdout, out_cut = _decode_tail(out or b"", max_output)
    stderr, err_cut = _decode_tail(err or b"", max_output)
    result = {"stdout": stdout, "stderr": stderr}
    if out_cut:
        result["stdout_truncated"] = True
    if err_cut:
        result["stderr_truncated"] = True
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
