"""A wheelhouse for the cluster: the wheels of the environment, chosen for its platform.

:func:`build_wheelhouse` collects

* the pinned distributions of the current environment (or a requirement list resolved with
  its dependencies, see :mod:`~dagster_slurm.environment.packing.requirements`), from the
  local :class:`~dagster_slurm.environment.packing.pool.WheelPool` or, for what it lacks,
  from pip: ``pip download --only-binary=:all: --no-deps`` with the cluster's platform
  arguments, or plain ``pip wheel`` (which may build sdists) when
  :func:`~dagster_slurm.environment.cluster.platform.local_builds_fit` says wheels for this
  machine run there. A pin with no wheel for the cluster is built here
  from source if the result is pure Python (``py3-none-any``);
* wheels built here with ``pip wheel --no-deps`` for distributions installed from a local
  directory, archive or VCS URL (the editable project itself), cached by a fingerprint of
  the source tree and built with fixed timestamps so unchanged sources give identical bytes;
* pip's own wheel (the installer: the cluster runs ``<python> pip-*.whl/pip install``, so it
  needs neither ``ensurepip`` nor internet access).

A second call with the same inputs reads everything from the cache and runs no pip at all.
:attr:`Wheelhouse.env_hash` is the content hash naming the environment on the cluster.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from filelock import FileLock
from packaging.utils import canonicalize_name

from dagster_slurm.environment.cluster.platform import PythonPlatform, local_builds_fit
from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.packing.hashing import cache_key, content_hash, tree_fingerprint
from dagster_slurm.environment.packing.pip import (
    SOURCE_DATE_EPOCH,
    PipRunner,
    download_args,
    missing_requirement,
    run_pip,
    wheel_args,
)
from dagster_slurm.environment.packing.pool import WheelFile, WheelPool, wheel_name
from dagster_slurm.environment.packing.requirements import (
    PIPES,
    InstalledDistribution,
    LocalSource,
    Pin,
    installed_distributions,
    requirements_with_pipes,
    select_from_environment,
)

KIND = "wheelhouse"
_log = logging.getLogger("dagster_slurm.environment")


@dataclass(frozen=True)
class Wheelhouse:
    """The wheels to install on the cluster and the installer (pip's wheel) to do it."""

    wheels: tuple[WheelFile, ...]
    installer: WheelFile
    platform: PythonPlatform

    def files(self) -> tuple[WheelFile, ...]:
        """Every file to upload, each once, sorted by name."""
        unique = {w.filename: w for w in (*self.wheels, self.installer)}
        return tuple(unique[name] for name in sorted(unique))

    @property
    def env_hash(self) -> str:
        """Content hash: sha256 over the sorted (file name, sha256) pairs (and the kind)."""
        return content_hash(KIND, ((w.filename, w.sha256) for w in self.files()))

    @property
    def size_bytes(self) -> int:
        return sum(w.path.stat().st_size for w in self.files())

    def requirements_text(self) -> str:
        """``name==version --hash=sha256:...`` per wheel, for ``pip install --require-hashes``."""
        lines = sorted(f"{w.name}=={w.version} --hash=sha256:{w.sha256}" for w in self.wheels)
        return "".join(line + "\n" for line in lines)


def build_wheelhouse(
    packages: Sequence[str] | None,
    cluster: PythonPlatform,
    local: PythonPlatform,
    cache_dir: Path,
    *,
    distributions: Sequence[InstalledDistribution] | None = None,
    pip: PipRunner = run_pip,
    log: logging.Logger | logging.LoggerAdapter = _log,
) -> Wheelhouse:
    """The wheelhouse of ``packages`` (None: the current environment) for ``cluster``."""
    fits = local_builds_fit(local, cluster)
    target = None if fits else cluster.pip_target_args()
    pool = WheelPool(Path(cache_dir) / "wheels" / cluster.key())
    fetcher = _Fetcher(pool, target, pip, log)
    with pool.lock():
        if packages is None:
            dists = installed_distributions() if distributions is None else distributions
            selection = select_from_environment(dists, cluster.marker_environment())
            log.info(
                "packing the current environment: %d pinned, %d built here (%s); left out: %s",
                len(selection.pins),
                len(selection.local),
                ", ".join(s.name for s in selection.local) or "none",
                ", ".join(selection.excluded) or "none",
            )
            wheels = fetcher.pins(selection.pins)
            local_sources = selection.local
        else:
            requirements = requirements_with_pipes(packages, _installed_version(PIPES))
            wheels = fetcher.resolved(requirements)
            local_sources = ()
        installer = fetcher.installer(_installed_version("pip"))
    for source in local_sources:
        wheels.append(build_local_wheel(source, Path(cache_dir), local, fits, pip, log))
    return Wheelhouse(_unique(wheels), installer, cluster)


class _Fetcher:
    """Pool lookups, and pip runs for what the pool lacks (the caller holds the pool lock)."""

    def __init__(
        self,
        pool: WheelPool,
        target: list[str] | None,
        pip: PipRunner,
        log: logging.Logger | logging.LoggerAdapter,
    ) -> None:
        self.pool = pool
        self.target = target
        self.pip = pip
        self.log = log

    def pins(self, pins: Sequence[Pin]) -> list[WheelFile]:
        wheels: list[WheelFile] = []
        missing: list[Pin] = []
        for pin in pins:
            found = self.pool.get(f"pin:{pin}")
            if found is None:
                missing.append(pin)
            else:
                wheels.extend(found)
        if missing:
            self.log.info("fetching %d of %d wheels (the rest are cached)", len(missing), len(pins))
            wheels.extend(self._fetch_pins(missing))
        return wheels

    def resolved(self, requirements: Sequence[str]) -> list[WheelFile]:
        key = f"set:{cache_key(sorted(requirements))}"
        found = self.pool.get(key)
        if found is not None:
            return found
        self.log.info("resolving %s for the cluster", ", ".join(requirements))
        with self.pool.staging() as tmp:
            reqs = tmp / "requirements.txt"
            reqs.write_text("".join(r + "\n" for r in requirements))
            dest = tmp / "wheels"
            if self.target is None:
                args = wheel_args(["-r", str(reqs)], str(dest), deps=True)
            else:
                args = download_args(str(reqs), str(dest), self.target, deps=True)
            self.pip(args, {}).check(f"fetching wheels for {', '.join(requirements)}")
            return self.pool.put(key, sorted(dest.glob("*.whl")))

    def installer(self, version: str | None) -> WheelFile:
        candidates = [f"pip=={version}", "pip"] if version else ["pip"]
        for index, requirement in enumerate(candidates):
            try:
                wheels = self.resolved([requirement])
            except EnvironmentSetupError:
                if index == len(candidates) - 1:
                    raise
                continue
            for wheel in wheels:
                if wheel.name == "pip":
                    return wheel
        raise EnvironmentSetupError("pip's own wheel could not be fetched for the cluster")

    def _fetch_pins(self, pins: Sequence[Pin]) -> list[WheelFile]:
        todo = {pin.name: pin for pin in pins}
        with self.pool.staging() as tmp:
            dest = tmp / "wheels"
            while todo:
                reqs = tmp / "requirements.txt"
                reqs.write_text("".join(f"{pin}\n" for pin in todo.values()))
                if self.target is None:
                    args = wheel_args(["-r", str(reqs)], str(dest), deps=False)
                else:
                    args = download_args(str(reqs), str(dest), self.target, deps=False)
                result = self.pip(args, {})
                if result.returncode == 0:
                    break
                failed = missing_requirement(result.stderr)
                pin = todo.get(canonicalize_name(failed.split("==")[0])) if failed else None
                if self.target is None or pin is None:
                    result.check("downloading wheels for the cluster")
                    return []  # unreachable: check raised
                self._build_pure(pin, dest, tmp)
                del todo[pin.name]
            return self._record_pins(pins, sorted(dest.glob("*.whl")))

    def _build_pure(self, pin: Pin, dest: Path, tmp: Path) -> None:
        """Build ``pin`` here from source; only a pure-Python wheel is of use to the cluster."""
        self.log.info("no wheel of %s for the cluster; building it here from source", pin)
        out = tmp / f"build-{pin.name}"
        self.pip(wheel_args([str(pin)], str(out), deps=False), {}).check(f"building {pin}")
        for path in out.glob("*.whl"):
            wheel = WheelFile.from_path(path)
            if not wheel.is_pure:
                raise EnvironmentSetupError(
                    f"{pin} has no wheel for the cluster and builds here only as "
                    f"{path.name}, which is not pure Python: use a version with cluster "
                    "wheels (env_packages) or a pre-deployed environment"
                )
            dest.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest / path.name)

    def _record_pins(self, pins: Sequence[Pin], paths: Sequence[Path]) -> list[WheelFile]:
        by_name = {wheel_name(path.name): path for path in paths}
        wheels = []
        for pin in pins:
            found = by_name.get(pin.name)
            if found is None:
                raise EnvironmentSetupError(f"pip reported success but produced no wheel for {pin}")
            wheels.extend(self.pool.put(f"pin:{pin}", [found]))
        return wheels


def build_local_wheel(
    source: LocalSource,
    cache_dir: Path,
    local: PythonPlatform,
    fits: bool,
    pip: PipRunner = run_pip,
    log: logging.Logger | logging.LoggerAdapter = _log,
) -> WheelFile:
    """The wheel of a distribution installed from a local path or URL, built here (cached)."""
    spec = source.origin.source_spec()
    path = source.origin.local_path
    if path is not None and not os.path.exists(path):
        raise EnvironmentSetupError(
            f"{source.name} is installed from {path}, which no longer exists: reinstall it "
            "or leave it out with env_packages"
        )
    fingerprint = tree_fingerprint(Path(path)) if path else spec
    key = cache_key(source.name, source.version, spec, fingerprint, local.key())
    parent = cache_dir / "built" / source.name
    out = parent / key
    parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(parent / ".lock"), timeout=3600):
        if not (out / ".complete").exists():
            log.info("building a wheel of %s from %s", source.name, spec)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=parent))
            try:
                env = {"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
                pip(wheel_args([spec], str(tmp), deps=False), env).check(f"building {source.name}")
                (tmp / ".complete").write_text(key)
                shutil.rmtree(out, ignore_errors=True)
                os.replace(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            _prune(parent, keep=out)
    wheels = [WheelFile.from_path(p) for p in sorted(out.glob("*.whl"))]
    matching = [w for w in wheels if w.name == source.name]
    if len(matching) != 1:
        raise EnvironmentSetupError(f"building {spec} gave {[w.filename for w in wheels]}")
    if not fits and not matching[0].is_pure:
        raise EnvironmentSetupError(
            f"{source.name} (installed from {spec}) builds here as {matching[0].filename}, "
            "which does not run on the cluster's platform: install it there "
            "(pre_deployed_env_path) or pack on a machine matching the cluster"
        )
    return matching[0]


def _prune(parent: Path, keep: Path, retain: int = 2) -> None:
    """Remove older builds of the same source, keeping the ``retain`` newest (``keep`` too)."""
    builds = sorted(
        (p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in builds[retain:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def _unique(wheels: Sequence[WheelFile]) -> tuple[WheelFile, ...]:
    by_name: dict[str, WheelFile] = {}
    for wheel in wheels:
        other = by_name.setdefault(wheel.name, wheel)
        if other.filename != wheel.filename:
            raise EnvironmentSetupError(
                f"two wheels of {wheel.name}: {other.filename} and {wheel.filename}"
            )
    return tuple(by_name[name] for name in sorted(by_name))


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
