"""The local cache of downloaded wheels for one cluster platform.

Layout under ``<env_cache_dir>/wheels/<platform key>/``::

    files/<wheel files>
    index.json    {"entries": {key: [{"file": name, "sha256": hex}, ...]}}
    .lock         file lock: step processes on this machine share the pool

Keys name what produced the files: ``pin:<name>==<version>`` for one pinned distribution,
``set:<key>`` for a requirement list resolved with its dependencies. A key whose files are
gone counts as missing. Files are only added, never rewritten: a name already present is
kept (an index serves the same bytes under the same file name).

Guarantees: the index is replaced atomically (temporary file and rename), and callers that
hold :meth:`WheelPool.lock` see each other's additions. Non-guarantee: nothing is evicted;
delete the directory to reclaim space.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.packing.hashing import file_sha256


@dataclass(frozen=True)
class WheelFile:
    """A wheel on this machine with its sha256, canonical name and version."""

    path: Path
    sha256: str
    name: str
    version: str

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def is_pure(self) -> bool:
        """True when every tag's platform is ``any`` (runs on every platform)."""
        _, _, _, tags = parse_wheel_filename(self.filename)
        return all(tag.platform == "any" for tag in tags)

    @classmethod
    def from_path(cls, path: Path, sha256: str | None = None) -> WheelFile:
        """Read name and version from the file name; hash the file unless ``sha256`` given."""
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename as exc:
            raise EnvironmentSetupError(f"{path} is not a wheel: {exc}") from None
        return cls(path, sha256 or file_sha256(path), str(name), str(version))


def wheel_name(filename: str) -> str:
    """The canonical distribution name in a wheel's file name."""
    try:
        return str(parse_wheel_filename(filename)[0])
    except InvalidWheelFilename as exc:
        raise EnvironmentSetupError(f"{filename} is not a wheel: {exc}") from None


class WheelPool:
    """Downloaded wheels and what produced them (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.files = self.root / "files"
        self.index_path = self.root / "index.json"

    def lock(self, timeout: float = 3600.0) -> FileLock:
        """The pool's file lock (hold it around lookups and additions)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".lock"), timeout=timeout)

    def get(self, key: str) -> list[WheelFile] | None:
        """The files recorded under ``key``; None when unknown or a file is gone."""
        entries = self._load().get(key)
        if entries is None:
            return None
        wheels = []
        for entry in entries:
            path = self.files / entry["file"]
            if not path.is_file():
                return None
            wheels.append(WheelFile.from_path(path, entry["sha256"]))
        return wheels

    def put(self, key: str, paths: Sequence[Path]) -> list[WheelFile]:
        """Move ``paths`` into the pool and record them under ``key``."""
        self.files.mkdir(parents=True, exist_ok=True)
        wheels = []
        for path in paths:
            target = self.files / path.name
            if not target.exists():
                os.replace(path, target)
            wheels.append(WheelFile.from_path(target))
        index = self._load()
        index[key] = [{"file": w.filename, "sha256": w.sha256} for w in wheels]
        self._save(index)
        return wheels

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A fresh directory inside the pool (same filesystem, so files move by rename)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def _load(self) -> dict[str, list[dict[str, str]]]:
        try:
            data = json.loads(self.index_path.read_text())
        except (OSError, ValueError):
            return {}
        entries = data.get("entries") if isinstance(data, dict) else None
        return dict(entries) if isinstance(entries, dict) else {}

    def _save(self, entries: dict[str, list[dict[str, str]]]) -> None:
        tmp = self.index_path.with_name(f".index.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"entries": entries}, indent=1, sort_keys=True))
        os.replace(tmp, self.index_path)
