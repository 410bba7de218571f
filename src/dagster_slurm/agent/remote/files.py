"""Agent operations on processes and files: ``exec``, ``tail``, ``write_file``, ``mkdir``, ``remove``.

Stdlib only, Python 3.8+.

Guarantees:

* ``exec`` never uses a shell; a timeout kills the command's whole process group.
* ``tail`` returns raw bytes (base64) starting exactly at the requested offset, at most
  ``max_bytes`` of them, and the offset right after them, so a caller that resumes from the
  returned offset neither loses nor repeats a byte across calls (or reconnects).
* ``write_file`` is atomic (temp file, fsync, rename) and sets the exact mode given. With
  ``wake`` it then writes one newline to that FIFO without ever blocking (see
  :func:`wake_fifo`); whatever happens there, the written file stands and the operation
  succeeds (``woken`` says whether a reader got the line).
* ``remove`` refuses any path that does not resolve strictly inside ``root`` (symlinks in
  the parent path are resolved first; a final symlink is removed, never followed).

Non-guarantees: ``tail`` does not detect a file replaced by another one of a larger size;
a shrunken file is reported with ``"truncated": true``.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import shutil
import stat

from .common import (
    OpContext,
    OpError,
    bad_request,
    get_argv,
    get_env,
    get_number,
    get_str,
    run_command,
)
from .document import make_dirs, write_atomic

MAX_TAIL_BYTES = 16 * 1024 * 1024


def op_exec(params: dict, ctx: OpContext) -> dict:
    """``exec``: ``argv``, ``stdin`` (text) or ``stdin_b64``, ``timeout``, ``env``, ``cwd``, ``check``.

    Returns ``rc``, ``stdout``, ``stderr``. A non-zero exit is a successful operation unless
    ``check`` is true, which turns it into a ``CommandFailed`` error.
    """
    argv = get_argv(params, "argv")
    stdin = _stdin_bytes(params)
    result = run_command(
        argv,
        stdin=stdin,
        timeout=get_number(params, "timeout", None),
        env=get_env(params),
        cwd=get_str(params, "cwd", None),
    )
    if params.get("check") and result["rc"] != 0:
        raise OpError("CommandFailed", f"{argv[0]!r} exited with code {result['rc']}", **result)
    return result


def op_tail(params: dict, ctx: OpContext) -> dict:
    """``tail``: ``files`` = [{path, offset, max_bytes}] → one entry per file, in order.

    A negative ``offset`` counts from the end of the file (the last ``-offset`` bytes).
    Entry fields: ``path``, ``exists``, ``size`` (None if missing), ``offset`` (where the next
    read starts), ``data`` (base64), ``eof`` (the returned data reaches the observed size),
    ``truncated`` (the file is shorter than the requested offset) and ``error`` if reading
    failed for another reason.
    """
    files = params.get("files")
    if not isinstance(files, list):
        raise bad_request("parameter 'files' must be a list")
    return {"files": [_tail_one(spec) for spec in files]}


def _tail_one(spec: object) -> dict:
    if not isinstance(spec, dict):
        raise bad_request("each tail entry must be an object")
    path = get_str(spec, "path")
    offset = int(get_number(spec, "offset", 0, minimum=-float("inf")))
    max_bytes = int(min(get_number(spec, "max_bytes", 1024 * 1024, minimum=1), MAX_TAIL_BYTES))
    entry = {
        "path": path,
        "exists": False,
        "size": None,
        "offset": offset,
        "data": "",
        "eof": True,
        "truncated": False,
    }
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            entry.update(exists=True, size=size)
            if offset < 0:  # counted from the end: the last -offset bytes
                offset = max(0, size + offset)
                entry["offset"] = offset
            if offset > size:
                entry["truncated"] = True
                return entry
            f.seek(offset)
            data = f.read(min(max_bytes, size - offset))
    except FileNotFoundError:
        return entry
    except OSError as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        return entry
    entry.update(
        offset=offset + len(data),
        data=base64.b64encode(data).decode("ascii"),
        eof=offset + len(data) >= size,
    )
    return entry


def op_write_file(params: dict, ctx: OpContext) -> dict:
    """``write_file``: ``path``, ``content`` (text) or ``content_b64``, ``mode`` (default
    0o600), ``makedirs`` and ``dir_mode`` (mode of the parents it creates, default 0o700),
    ``wake`` (a FIFO to write one newline to once the file is written; see
    :func:`wake_fifo`: it never fails the operation). Returns ``path``, ``size`` and, with
    ``wake``, ``woken`` (a reader got the line) and ``wake`` (what happened, in words)."""
    path = get_str(params, "path")
    if "content_b64" in params:
        data = _b64(params["content_b64"], "content_b64")
    elif isinstance(params.get("content"), str):
        data = params["content"].encode("utf-8")
    else:
        raise bad_request("write_file needs 'content' (string) or 'content_b64'")
    mode = _mode(params, 0o600)
    if params.get("makedirs"):
        make_dirs(os.path.dirname(os.path.abspath(path)), _mode(params, 0o700, "dir_mode"))
    write_atomic(path, data, mode)
    result = {"path": path, "size": len(data)}
    wake = params.get("wake")
    if isinstance(wake, str) and wake:
        try:
            result["woken"], result["wake"] = wake_fifo(wake)
        except Exception as exc:  # the file is written: the wake-up never fails the write
            result["woken"], result["wake"] = False, f"{type(exc).__name__}: {exc}"
    return result


def wake_fifo(path: str) -> tuple[bool, str]:
    """Write one newline to the FIFO at ``path`` if a process of this host holds it open
    for reading; never blocks, never raises. Returns (woken, what happened): ``(True,
    "woken")``, ``(True, "pending")`` when the pipe is full (its reader has lines to read
    already), or False with the reason: no such file, not a FIFO, no reader on this host
    (a FIFO on a shared filesystem carries nothing between hosts), another error."""
    try:
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            return False, "not a FIFO"
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False, "no such file"
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return False, "no reader on this host"
        return False, f"{type(exc).__name__}: {exc}"
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # replaced since the lstat
            return False, "not a FIFO"
        os.write(fd, b"\n")
        return True, "woken"
    except BlockingIOError:
        return True, "pending"
    except OSError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        os.close(fd)


def op_mkdir(params: dict, ctx: OpContext) -> dict:
    """``mkdir``: ``path`` and its missing parents, each with ``mode`` (default 0o755);
    existing is fine."""
    path = get_str(params, "path")
    existed = os.path.isdir(path)
    make_dirs(path, _mode(params, 0o755))
    return {"path": path, "created": not existed}


def op_remove(params: dict, ctx: OpContext) -> dict:
    """``remove``: a file, symlink or directory tree at ``path``, strictly inside ``root``."""
    path = get_str(params, "path")
    root = os.path.realpath(get_str(params, "root"))
    absolute = os.path.abspath(path)
    name = os.path.basename(absolute)
    target = os.path.join(os.path.realpath(os.path.dirname(absolute)), name)
    if name in ("", ".", "..") or not target.startswith(root.rstrip(os.sep) + os.sep):
        raise OpError("PathOutsideRoot", f"refusing to remove {path!r}: not inside {root!r}")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return {"path": path, "existed": False}
    if stat.S_ISDIR(st.st_mode):  # lstat: a symlink to a directory is not a directory here
        shutil.rmtree(target)
    else:
        os.unlink(target)
    return {"path": path, "existed": True}


def _stdin_bytes(params: dict) -> bytes | None:
    if params.get("stdin_b64") is not None:
        return _b64(params["stdin_b64"], "stdin_b64")
    stdin = params.get("stdin")
    if stdin is None:
        return None
    if not isinstance(stdin, str):
        raise bad_request("parameter 'stdin' must be a string")
    return stdin.encode("utf-8")


def _b64(value: object, name: str) -> bytes:
    if not isinstance(value, str):
        raise bad_request(f"parameter {name!r} must be a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise bad_request(f"parameter {name!r} is not valid base64") from None


def _mode(params: dict, default: int, name: str = "mode") -> int:
    mode = params.get(name, default)
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise bad_request(f"parameter {name!r} must be an integer permission mode (0..0o7777)")
    return mode
