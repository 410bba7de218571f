"""The agent's request/response protocol and its entry point.

Stdlib only, Python 3.8+.

Request (standard input, one JSON object)::

    {"protocol": 1, "ops": [{"op": "txn", ..., "requires": [0]}, ...]}

Response (standard output, one JSON object)::

    {"protocol": 1, "results": [{"ok": true, ...}, ...], "now": <login node epoch seconds>}

Operations run in order. Every result has ``ok``; a failed one has
``"error": {"type", "message"}`` and possibly more fields (a failed transaction still
returns ``doc`` and ``version``); ``warnings`` lists what the caller should know (a broken
stale lock). ``requires`` lists indices of earlier operations that must have succeeded;
otherwise the operation is skipped: ``{"ok": false, "skipped": true, "error": ...}``.
``now`` is read after the last operation. A request with ``"hello": true`` (the client's
first of a connection) also gets ``"slurm_version": {"text": "slurm 24.11.5"}`` (the first
line of ``squeue --version``, run once per agent process; ``text`` None and ``error`` set
when it cannot be run), so the Slurm release is learnt without a round trip of its own.

Guarantees: the program never dies on bad input. A request that cannot be understood (not
JSON, wrong protocol, ``ops`` not a list) yields ``{"protocol": 1, "error": {...}}`` and exit
status 2; problems inside one operation are reported in its result and do not affect the
others. Exit status 0 means the request was processed (individual ops may have failed).
The program never exits with 97, which the library's launcher reserves for "not installed".
SIGTERM and SIGHUP (for example a dropped SSH connection) unwind normally, so a held lock is
released and a half-written temporary file is removed.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from .common import OpContext, OpError, run_command
from .document import op_read, op_txn
from .files import op_exec, op_mkdir, op_remove, op_tail, op_write_file
from .observe import op_observe_session
from .scan import op_scan
from .scheduler import op_job_status, op_submit

PROTOCOL_VERSION = 1
EXIT_OK = 0
EXIT_BAD_REQUEST = 2
EXIT_INTERNAL = 3

HANDLERS: dict = {
    "exec": op_exec,
    "job_status": op_job_status,
    "observe_session": op_observe_session,
    "txn": op_txn,
    "read": op_read,
    "scan": op_scan,
    "tail": op_tail,
    "submit": op_submit,
    "write_file": op_write_file,
    "mkdir": op_mkdir,
    "remove": op_remove,
}


#: What answers a request's ``hello``: the Slurm client's own ``--version`` (no RPC).
SLURM_VERSION_ARGV = ["squeue", "--version"]
_slurm_version: dict | None = None


def slurm_version(run: Callable[..., dict] = run_command) -> dict:
    """``{"text": <first line of squeue --version>}``, or ``{"text": None, "error": ...}``
    when it cannot be run; a serving agent keeps a good answer (a failed one is asked
    again by the next hello)."""
    global _slurm_version
    if _slurm_version is None:
        try:
            out = run(SLURM_VERSION_ARGV, timeout=10.0)
        except OpError as exc:
            answer: dict = {"text": None, "error": f"{exc.type}: {exc.message}"}
        else:
            lines = (out.get("stdout") or "").strip().splitlines()
            answer = {"text": lines[0] if lines else None}
            if out.get("rc") != 0 or not lines:
                answer["error"] = ((out.get("stderr") or "").strip()[-500:]
                                   or f"exit status {out.get('rc')}")
        if "error" in answer:
            return answer
        _slurm_version = answer
    return _slurm_version


class BadRequest(Exception):
    """The request as a whole cannot be processed."""


def error_result(type_: str, message: str, **fields: Any) -> dict:
    result = {"ok": False, "error": {"type": type_, "message": message}}
    result.update(fields)
    return result


def run_op(op: Any, index: int, results: list, make_context: Callable[[], OpContext]) -> dict:
    """Run one operation (never raises an ``Exception``) and return its result."""
    if not isinstance(op, dict):
        return error_result("BadRequest", f"op {index} is not an object")
    requires = op.get("requires", [])
    if not isinstance(requires, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < index for i in requires
    ):
        return error_result("BadRequest", "requires must list indices of earlier ops")
    failed = [i for i in requires if not results[i].get("ok")]
    if failed:
        return error_result("Skipped", f"required op(s) {failed} did not succeed", skipped=True)
    handler = HANDLERS.get(op.get("op"))
    if handler is None:
        return error_result("UnknownOp", f"unknown op {op.get('op')!r}")
    ctx = make_context()
    try:
        result = {"ok": True}
        result.update(handler(op, ctx))
    except OpError as exc:
        result = error_result(exc.type, exc.message, **exc.fields)
    except OSError as exc:
        result = error_result("OSError", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # one broken op must not take the others down
        result = error_result("InternalError", f"{type(exc).__name__}: {exc}")
    if ctx.warnings:
        result["warnings"] = list(ctx.warnings)
    return result


def handle_request(
    request: Any,
    make_context: Callable[[], OpContext] = OpContext,
    clock: Callable[[], float] = time.time,
) -> dict:
    """Process a decoded request; raises :class:`BadRequest` when it is malformed."""
    if not isinstance(request, dict):
        raise BadRequest("request must be a JSON object")
    if request.get("protocol") != PROTOCOL_VERSION:
        raise BadRequest(
            f"unsupported protocol {request.get('protocol')!r}; this agent speaks {PROTOCOL_VERSION}"
        )
    ops = request.get("ops")
    if not isinstance(ops, list):
        raise BadRequest("'ops' must be a list")
    results: list = []
    for index, op in enumerate(ops):
        results.append(run_op(op, index, results, make_context))
    response = {"protocol": PROTOCOL_VERSION, "results": results, "now": clock()}
    if request.get("hello") is True:
        response["slurm_version"] = slurm_version()
    return response


def main(stdin: Any = None, stdout: Any = None, argv: Any = None) -> int:
    """Answer one request (read to EOF), or with ``--serve`` one request per line until EOF.

    Serve mode keeps one process per connection so that a request costs no interpreter
    start: every line of standard input is a request and gets exactly one line of response,
    flushed at once. The process ends when its standard input closes (the client closed the
    stream or the SSH connection dropped). Returns the exit code.
    """
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout.buffer
    argv = sys.argv[1:] if argv is None else argv
    _unwind_on_signals()
    if "--serve" in argv:
        for line in iter(stdin.readline, b""):
            if line.strip():
                _respond(line, stdout)
        return EXIT_OK
    return _respond(stdin.read(), stdout)


def _respond(raw: bytes, stdout: Any) -> int:
    code = EXIT_OK
    try:
        try:
            request = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"request is not valid JSON: {exc}") from None
        response = handle_request(request)
    except BadRequest as exc:
        response, code = _top_error("BadRequest", str(exc)), EXIT_BAD_REQUEST
    except Exception as exc:  # report instead of a traceback
        response, code = _top_error("InternalError", f"{type(exc).__name__}: {exc}"), EXIT_INTERNAL
    stdout.write(json.dumps(response).encode("ascii"))
    stdout.write(b"\n")
    stdout.flush()
    return code


def _top_error(type_: str, message: str) -> dict:
    return {
        "protocol": PROTOCOL_VERSION,
        "error": {"type": type_, "message": message},
        "now": time.time(),
    }


def _unwind_on_signals() -> None:
    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(signum, stop)
        except (ValueError, OSError):
            pass  # not the main thread
