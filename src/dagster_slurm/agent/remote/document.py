"""Versioned JSON documents on disk: atomic writes and the ``txn`` and ``read`` operations.

Stdlib only, Python 3.8+. :func:`transact_document` is pure and is also what the library's
in-memory state store runs, so file-backed and in-memory documents follow the same rules.

A document is a JSON object carrying ``schema_version`` (set by whoever creates it) and
``version``, owned by the store: ``0`` before the first write, then increased by exactly one
on every write. Patches may ``test`` ``/version`` but never change it.

Guarantees:

* A transaction runs under the document's lock: read, patch, write, release. Transactions on
  the same document are serialised, so a ``test`` followed by writes is a compare-and-set.
* All or nothing: a failing operation (conflict or error) writes nothing, and the result
  still carries the current document and version.
* Writes are atomic: a temporary file in the same directory is written, fsynced and renamed
  over the document (then the directory is fsynced), so readers see the old or the new
  document, never a partial one. That is also why :func:`op_read` needs no lock.
* A patch that changes nothing writes nothing and keeps the version.
* With ``max_schema_version``, a document written by a newer schema is never modified.

Non-guarantees: on NFS, a reader on another client may see the previous version for the
attribute-cache interval; durability after power loss depends on the filesystem honouring
fsync.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from .common import OpContext, OpError, bad_request, get_number, get_str
from .lock import locked
from .patch import PatchConflict, PatchError, apply_patch, json_equal, parse_pointer

VERSION_KEY = "version"
SCHEMA_KEY = "schema_version"
_READ_ONLY_OPS = ("test", "absent")


def document_version(doc: dict | None) -> int:
    """The store version of ``doc`` (0 for a missing document or one never written)."""
    if not doc:
        return 0
    version = doc.get(VERSION_KEY, 0)
    return version if isinstance(version, int) and not isinstance(version, bool) else 0


def transact_document(
    current: dict | None,
    patch: list,
    create: dict | None,
    now: float,
    max_schema_version: int | None = None,
) -> tuple:
    """Apply ``patch`` to ``current`` (or to ``create`` when there is no document yet).

    Returns ``(new_doc, changed)``; ``new_doc`` carries the next version when ``changed``.
    Raises :class:`PatchConflict`/:class:`PatchError` from the patch, ``OpError`` of type
    ``DocumentMissing`` (no document and nothing to create) or ``SchemaTooNew``.
    """
    _check_patch_targets(patch)
    if current is None:
        if create is None:
            raise OpError("DocumentMissing", "the document does not exist and create was not given")
        if not isinstance(create, dict):
            raise bad_request("create must be a JSON object")
        base, created = dict(create), True
        base[VERSION_KEY] = 0
    else:
        base, created = current, False
    schema = base.get(SCHEMA_KEY, 0)
    if max_schema_version is not None and isinstance(schema, int) and schema > max_schema_version:
        raise OpError(
            "SchemaTooNew",
            f"document has schema_version {schema}, this library writes at most "
            f"{max_schema_version}; upgrade dagster-slurm",
        )
    version = document_version(base)
    new = apply_patch(base, patch, now)
    if not isinstance(new, dict):
        raise PatchError(len(patch) - 1, "the document must stay a JSON object")
    new[VERSION_KEY] = version
    changed = created or not json_equal(new, base)
    if changed:
        new[VERSION_KEY] = version + 1
    return new, changed


def read_document(path: str) -> dict | None:
    """The document at ``path``, or None when the file does not exist."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise OpError("CorruptDocument", f"{path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OpError("CorruptDocument", f"{path} does not hold a JSON object")
    return doc


def encode_document(doc: dict) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8")


def make_dirs(path: str, mode: int) -> None:
    """Create ``path`` and its missing parents, each with exactly ``mode``.

    Unlike ``os.makedirs`` every directory created gets ``mode`` (the umask does not
    apply, and parents are not left at the umask's default); directories that exist
    already, also ones another process creates meanwhile, are left as they are.
    """
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue
        os.chmod(directory, mode)


def write_atomic(path: str, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (temp file, fsync, rename, directory fsync).
    ``durable`` False skips both fsyncs (a cache that a crash may lose: still never half
    written)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_directory(directory)


def locked_transaction(
    state: dict, ctx: OpContext, build: Callable[[dict | None, float], list], purpose: str
) -> dict:
    """Run one transaction on the document described by ``state``.

    ``state`` holds ``path``, ``lock``, optional ``timeout`` (lock wait, seconds), ``create``,
    ``dir_mode`` (mode of the directories ``create`` makes, default 0o700: private) and
    ``max_schema_version``. ``build(current_doc, now)`` returns the patch, called while
    the lock is held. Returns ``doc``, ``version``, ``written`` and ``now``; a failed patch
    raises ``OpError`` (``Conflict`` or ``PatchError``) that still carries the current
    ``doc`` and ``version``.
    """
    path = get_str(state, "path")
    lock_path = get_str(state, "lock")
    timeout = get_number(state, "timeout", 30.0)
    create = state.get("create")
    max_schema = state.get("max_schema_version")
    if max_schema is not None and (isinstance(max_schema, bool) or not isinstance(max_schema, int)):
        raise bad_request("max_schema_version must be an integer")
    dir_mode = state.get("dir_mode", 0o700)
    if isinstance(dir_mode, bool) or not isinstance(dir_mode, int) or not 0 <= dir_mode <= 0o7777:
        raise bad_request("parameter 'dir_mode' must be an integer permission mode (0..0o7777)")
    if create is not None:
        for directory in {os.path.dirname(path), os.path.dirname(lock_path)}:
            if directory:
                make_dirs(directory, dir_mode)
    with locked(
        lock_path,
        timeout,
        purpose,
        ctx.warnings,
        clock=ctx.clock,
        monotonic=ctx.monotonic,
        sleep=ctx.sleep,
    ):
        now = ctx.clock()
        current = read_document(path)
        try:
            new, changed = transact_document(current, build(current, now), create, now, max_schema)
        except PatchConflict as exc:
            raise OpError(
                "Conflict",
                str(exc),
                conflict=exc.to_dict(),
                doc=current,
                version=document_version(current),
                now=now,
            ) from None
        except PatchError as exc:
            raise OpError(
                "PatchError", str(exc), doc=current, version=document_version(current), now=now
            ) from None
        if changed:
            write_atomic(path, encode_document(new))
    return {"doc": new, "version": new[VERSION_KEY], "written": changed, "now": now}


def op_txn(params: dict, ctx: OpContext) -> dict:
    """``txn``: ``path``, ``lock``, ``patch``, ``timeout``, ``create``, ``max_schema_version``."""
    patch = params.get("patch")
    if not isinstance(patch, list):
        raise bad_request("parameter 'patch' must be a list of operations")
    path = get_str(params, "path")
    return locked_transaction(params, ctx, lambda _doc, _now: patch, f"txn {path}")


def op_read(params: dict, ctx: OpContext) -> dict:
    """``read``: the document at ``path`` without taking the lock."""
    doc = read_document(get_str(params, "path"))
    return {"exists": doc is not None, "doc": doc, "version": document_version(doc)}


def _check_patch_targets(patch: Any) -> None:
    if not isinstance(patch, list):
        raise PatchError(0, "patch must be a list of operations")
    for index, op in enumerate(patch):
        if not isinstance(op, dict) or op.get("op") in _READ_ONLY_OPS:
            continue
        try:
            tokens = parse_pointer(op.get("path"))
        except ValueError:
            continue  # reported by apply_patch
        if tokens and tokens[0] == VERSION_KEY:
            raise PatchError(index, "/version is maintained by the store and cannot be patched")


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
