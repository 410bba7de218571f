"""Packing a pixi project with ``pixi-pack`` (used when pixi is installed here).

Detection (:func:`pixi_tools_available`, :func:`find_pixi_project`): ``pixi`` and
``pixi-pack`` on ``PATH``, and a ``pixi.toml`` (or a ``pyproject.toml`` with a
``[tool.pixi...]`` table) in the project directory or a parent, next to its ``pixi.lock``.

Packing (:func:`build_pixi_pack`): ``pixi-pack --environment <env> --platform <conda
platform> --create-executable --output-file <cache>/<key>/environment.sh <manifest>`` — a
self-extracting script that carries the conda packages and the unpacker, so the cluster
needs neither pixi nor internet access. The result is cached by a key of the lock file's
hash, the environment and the platform; a second call runs nothing.

Unpacking on the cluster (:func:`unpack_argv`): ``bash environment.sh --output-directory
<dir> --env-name env`` creates ``<dir>/env`` and ``<dir>/activate.sh``.

The pixi-pack invocation follows pixi-pack's documented command line; it is exercised here
only against a stand-in program, not against a real pixi-pack.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from dagster_slurm.environment.cluster.platform import PythonPlatform
from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.packing.hashing import cache_key, content_hash, file_sha256

KIND = "pixi"
SCRIPT_NAME = "environment.sh"
ENV_NAME = "env"
_CONDA_ARCH = {
    "x86_64": "64",
    "i686": "32",
    "aarch64": "aarch64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "armv7l": "armv7l",
}
_log = logging.getLogger("dagster_slurm.environment")

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class PixiProject:
    """A pixi manifest, its lock file and the environment to pack."""

    manifest: Path
    lockfile: Path
    environment: str = "default"


@dataclass(frozen=True)
class PixiPack:
    """A packed environment: the self-extracting script and its content hash."""

    script: Path
    sha256: str
    conda_platform: str

    @property
    def env_hash(self) -> str:
        return content_hash(KIND, [(SCRIPT_NAME, self.sha256)])

    @property
    def size_bytes(self) -> int:
        return self.script.stat().st_size


def pixi_tools_available(which: Callable[[str], str | None] = shutil.which) -> bool:
    """True when both ``pixi`` and ``pixi-pack`` are on ``PATH``."""
    return which("pixi") is not None and which("pixi-pack") is not None


def find_pixi_project(start: Path, environment: str = "default") -> PixiProject | None:
    """The nearest pixi project at or above ``start``; None when there is none."""
    start = Path(start).resolve()
    for directory in (start, *start.parents):
        toml = directory / "pixi.toml"
        if toml.is_file():
            return PixiProject(toml, directory / "pixi.lock", environment)
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _has_pixi_table(pyproject):
            return PixiProject(pyproject, directory / "pixi.lock", environment)
    return None


def _has_pixi_table(pyproject: Path) -> bool:
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return False
    return any(line.strip().startswith("[tool.pixi") for line in text.splitlines())


def conda_platform(platform: PythonPlatform) -> str:
    """The conda subdir of a platform, e.g. ``linux-64`` or ``linux-aarch64``."""
    arch = _CONDA_ARCH.get(platform.arch)
    if platform.os != "linux" or arch is None:
        raise EnvironmentSetupError(
            f"no conda platform for {platform.describe()}: packed environments need Linux"
        )
    return f"linux-{arch}"


def pack_command(project: PixiProject, platform: str, output: Path) -> list[str]:
    """The ``pixi-pack`` argv that writes a self-extracting script to ``output``."""
    return [
        "pixi-pack",
        "--environment",
        project.environment,
        "--platform",
        platform,
        "--create-executable",
        "--output-file",
        str(output),
        str(project.manifest),
    ]


def unpack_argv(script: str, output_dir: str) -> list[str]:
    """The argv that unpacks the script into ``output_dir`` on the cluster (no pixi there)."""
    return ["bash", script, "--output-directory", output_dir, "--env-name", ENV_NAME]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )


def build_pixi_pack(
    project: PixiProject,
    platform: PythonPlatform,
    cache_dir: Path,
    *,
    run: Runner = run_command,
    log: logging.Logger | logging.LoggerAdapter = _log,
) -> PixiPack:
    """Pack ``project`` for ``platform`` (cached by the lock file's content)."""
    if not project.lockfile.is_file():
        raise EnvironmentSetupError(
            f"{project.manifest} has no lock file {project.lockfile.name}: run `pixi lock` "
            "(or `pixi install`) first, so the packed environment is reproducible"
        )
    lock_text = project.lockfile.read_bytes()
    if b"dagster-pipes" not in lock_text and b"dagster_pipes" not in lock_text:
        log.warning(
            "%s does not mention dagster-pipes; the payload imports it: add it to the pixi "
            "environment %r",
            project.lockfile,
            project.environment,
        )
    target = conda_platform(platform)
    key = cache_key(KIND, file_sha256(project.lockfile), project.environment, target)
    out_dir = Path(cache_dir) / "pixi" / key
    script = out_dir / SCRIPT_NAME
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir.parent / f".{key}.lock"), timeout=3600):
        if not script.is_file():
            _pack_into(project, target, out_dir, run, log)
    return PixiPack(script, file_sha256(script), target)


def _pack_into(
    project: PixiProject,
    target: str,
    out_dir: Path,
    run: Runner,
    log: logging.Logger | logging.LoggerAdapter,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        argv = pack_command(project, target, tmp / SCRIPT_NAME)
        log.info("packing pixi environment %r for %s", project.environment, target)
        proc = run(argv)
        if proc.returncode != 0 or not (tmp / SCRIPT_NAME).is_file():
            raise EnvironmentSetupError(
                f"{' '.join(argv)} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-3000:]}"
            )
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
