"""Running this interpreter's pip, and the pure pieces around it.

:func:`run_pip` is the only place that starts pip; callers take a :data:`PipRunner` so tests
can substitute a fake. :func:`download_args` and :func:`wheel_args` build the argument lists
(pure); :func:`missing_requirement` reads pip's "no matching distribution" error.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dagster_slurm.environment.errors import EnvironmentSetupError

#: Fixed zip timestamps for wheels built here (1980-01-01), so that rebuilding unchanged
#: sources gives byte-identical wheels and thus the same environment hash.
SOURCE_DATE_EPOCH = "315532800"
_COMMON = ["--disable-pip-version-check", "--no-input"]
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")


@dataclass(frozen=True)
class PipResult:
    """Exit code and output of one pip command."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def check(self, what: str) -> PipResult:
        """Return self, or raise :class:`EnvironmentSetupError` naming ``what`` on failure."""
        if self.returncode != 0:
            tail = (self.stderr.strip() or self.stdout.strip())[-3000:]
            raise EnvironmentSetupError(
                f"{what} failed: pip {' '.join(self.args)} exited with code "
                f"{self.returncode}:\n{tail}"
            )
        return self


PipRunner = Callable[[Sequence[str], Mapping[str, str]], PipResult]


def run_pip(args: Sequence[str], env: Mapping[str, str], timeout: float = 3600.0) -> PipResult:
    """Run ``python -m pip <args>`` with this interpreter; ``env`` adds variables."""
    if importlib.util.find_spec("pip") is None:
        raise EnvironmentSetupError(
            f"pip is not installed in {sys.prefix}, so this environment cannot be packed: "
            "install pip here, or set pre_deployed_env_path"
        )
    argv = [sys.executable, "-m", "pip", *args]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentSetupError(
            f"pip {' '.join(args)} did not finish in {timeout:.0f} s"
        ) from None
    return PipResult(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def download_args(
    requirements_file: str, dest: str, target: Sequence[str] | None, *, deps: bool
) -> list[str]:
    """``pip download`` of binary wheels for ``target`` (pip's platform arguments)."""
    args = ["download", *_COMMON, "--only-binary=:all:", "--dest", dest]
    if not deps:
        args.append("--no-deps")
    return [*args, *(target or ()), "-r", requirements_file]


def wheel_args(sources: Sequence[str], dest: str, *, deps: bool) -> list[str]:
    """``pip wheel``: download wheels and build the rest here (for this machine's platform).

    ``sources`` are requirement strings, paths or URLs; ``-r <file>`` pairs pass through.
    """
    args = ["wheel", *_COMMON, "--wheel-dir", dest]
    if not deps:
        args.append("--no-deps")
    return [*args, *sources]


def missing_requirement(stderr: str) -> str | None:
    """The requirement pip found no distribution for, from its error output."""
    match = _NO_MATCH.search(stderr)
    return match.group(1) if match else None
