"""Agent operation ``scan``: find documents at a fixed depth below roots and read them all.

Stdlib only, Python 3.8+. What the orphan reconciliation does at every tick, in one
operation: list ``<root>/*/.../<name>`` at exactly ``depth`` levels below each root (no
subprocess, one directory listing per level), read every document found without its lock,
and with ``sibling`` also the first ``sibling_bytes`` of the file of that name next to it.

Parameters: ``scan`` (a list of ``{"root", "name", "depth", "sibling"?}``), optional
``sibling_bytes`` (default 256). A missing root lists nothing. Returns ``entries``: one per
document found, ``{"path", "exists", "doc", "version"}`` plus ``error`` when the document
could not be read (then ``doc`` is None) and ``sibling`` (``{"exists", "data"}``) when asked.
"""

from __future__ import annotations

import os

from .common import OpContext, bad_request, get_number
from .document import document_version, read_document

MAX_ENTRIES = 100_000


def op_scan(params: dict, ctx: OpContext) -> dict:
    """``scan``: see the module docstring."""
    specs = params.get("scan")
    if not isinstance(specs, list) or not specs:
        raise bad_request("parameter 'scan' must be a non-empty list of {root, name, depth}")
    sibling_bytes = int(get_number(params, "sibling_bytes", 256))
    entries: list = []
    for spec in specs:
        if not isinstance(spec, dict):
            raise bad_request("each scan entry must be an object with root, name and depth")
        root, name, depth = spec.get("root"), spec.get("name"), spec.get("depth")
        sibling = spec.get("sibling")
        if not isinstance(root, str) or not root.startswith("/"):
            raise bad_request("scan root must be an absolute path")
        if not isinstance(name, str) or not name or "/" in name:
            raise bad_request("scan name must be a file name")
        if not isinstance(depth, int) or not 1 <= depth <= 8:
            raise bad_request("scan depth must be an integer from 1 to 8")
        if sibling is not None and (not isinstance(sibling, str) or "/" in sibling):
            raise bad_request("scan sibling must be a file name")
        for path in _at_depth(root.rstrip("/") or "/", depth - 1):
            if len(entries) >= MAX_ENTRIES:
                ctx.warnings.append(f"scan stopped after {MAX_ENTRIES} documents")
                return {"entries": entries}
            document = os.path.join(path, name)
            if not os.path.isfile(document):
                continue
            entries.append(_entry(document, sibling, sibling_bytes))
    return {"entries": entries}


def _at_depth(root: str, levels: int) -> list:
    """Directories exactly ``levels`` levels below ``root`` (``root`` itself for 0), sorted."""
    current = [root]
    for _ in range(levels):
        below = []
        for directory in current:
            try:
                with os.scandir(directory) as listing:
                    below.extend(e.path for e in listing if e.is_dir(follow_symlinks=False))
            except OSError:
                continue  # missing or unreadable: nothing below it
        current = sorted(below)
    return current


def _entry(path: str, sibling: str | None, sibling_bytes: int) -> dict:
    entry: dict = {"path": path}
    try:
        doc = read_document(path)
        entry.update(exists=doc is not None, doc=doc, version=document_version(doc))
    except Exception as exc:  # noqa: BLE001 - one unreadable document does not stop the scan
        entry.update(exists=True, doc=None, version=0, error=f"{type(exc).__name__}: {exc}")
    if sibling is not None:
        other = os.path.join(os.path.dirname(path), sibling)
        try:
            with open(other, "rb") as handle:
                data = handle.read(max(1, sibling_bytes))
            entry["sibling"] = {"exists": True, "data": data.decode("utf-8", "replace")}
        except OSError:
            entry["sibling"] = {"exists": False, "data": None}
    return entry
