"""Content hashes and cache keys of packed environments.

:func:`content_hash` (pure) names an environment on the cluster: sha256 over the layout
version, the pack kind and the sorted ``(file name, sha256 of the file)`` pairs, so the same
files give the same hash on every machine, in any order. :func:`cache_key` names local cache
entries. :func:`file_sha256` and :func:`tree_fingerprint` read the disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

#: Bumped when the remote layout or installation procedure changes, so that environments
#: built by an older procedure are not reused by a newer one.
LAYOUT_VERSION = 1
#: Directories never part of a source tree's fingerprint.
IGNORED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        "build",
        "dist",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
        "node_modules",
        ".pixi",
        ".eggs",
        "site",
    }
)
_CHUNK = 1024 * 1024


def content_hash(kind: str, files: Iterable[tuple[str, str]]) -> str:
    """sha256 (hex) of ``kind`` and the sorted ``(name, sha256)`` pairs of ``files``."""
    entries = sorted(set(files))
    names = [name for name, _ in entries]
    if len(names) != len(set(names)):
        raise ValueError(f"two different files share a name in {names}")
    digest = hashlib.sha256(f"dagster-slurm-env/{LAYOUT_VERSION}/{kind}\n".encode())
    for name, sha in entries:
        if "\n" in name or "\t" in name:
            raise ValueError(f"file name {name!r} contains a tab or newline")
        digest.update(f"{name}\t{sha}\n".encode())
    return digest.hexdigest()


def cache_key(*parts: object) -> str:
    """A short stable key of JSON-serialisable ``parts`` (for local cache directories)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_fingerprint(root: Path) -> str:
    """sha256 of every file's relative path, size and mtime under ``root`` (contents unread).

    Skips :data:`IGNORED_DIRS` and ``*.egg-info`` directories, which builds write into the
    tree. Cheap enough to run on every preparation; a changed file changes the fingerprint.
    """
    root = Path(root)
    if root.is_file():
        stat = root.stat()
        return cache_key(root.name, stat.st_size, stat.st_mtime_ns)
    digest = hashlib.sha256()
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in IGNORED_DIRS and not d.endswith(".egg-info")
        )
        for name in sorted(filenames):
            path = os.path.join(directory, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            rel = os.path.relpath(path, root)
            digest.update(f"{rel}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
