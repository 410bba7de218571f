"""The Python platform of the cluster and the pip arguments that select wheels for it.

Mechanism: :func:`probe_cluster` runs :mod:`~dagster_slurm.environment.cluster.remote_probe` on the
login node (one agent ``exec``, no shell) and :func:`local_platform` runs the same code here.

Policy (pure, unit tested): :func:`parse_probe` turns the probe's JSON into a
:class:`PythonPlatform`; :meth:`PythonPlatform.pip_target_args` gives pip's ``--platform``,
``--python-version``, ``--implementation`` and ``--abi`` arguments (every manylinux tag the
cluster's glibc accepts, newest first, then ``linux_<arch>``);
:func:`local_builds_fit` tells whether wheels chosen or built for this machine also run on
the cluster, in which case pip may run without target arguments (and build sdists).

Only Linux clusters are supported for packed environments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from dagster_slurm.environment.errors import EnvironmentSetupError

if TYPE_CHECKING:
    from dagster_slurm.agent.client import AgentClient

_IMPL_TAGS = {"cpython": "cp", "pypy": "pp"}
_IMPL_NAMES = {"cpython": "CPython", "pypy": "PyPy"}
#: Legacy manylinux names and the architectures they were defined for.
_LEGACY_MANYLINUX = {
    17: (
        "manylinux2014",
        frozenset({"x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x"}),
    ),
    12: ("manylinux2010", frozenset({"x86_64", "i686"})),
    5: ("manylinux1", frozenset({"x86_64", "i686"})),
}
#: The oldest glibc minor version manylinux defines per architecture (2.5 or 2.17).
_OLDEST_GLIBC_MINOR = {"x86_64": 5, "i686": 5}
_DEFAULT_OLDEST_GLIBC_MINOR = 17
_ARCH_32BIT = {"x86_64": "i686", "aarch64": "armv7l"}


@dataclass(frozen=True)
class PythonPlatform:
    """What decides which wheels an interpreter can install.

    ``abi`` is the wheel ABI tag (``cp311``, ``cp313t``, ``pypy39_pp73``); ``arch`` the
    architecture of wheel platform tags (``x86_64``); ``machine`` what
    ``platform.machine()`` says; ``libc`` is ``glibc``, ``musl`` or None, with
    ``libc_version`` as (major, minor). ``executable`` and ``has_venv`` (the ``venv``
    module is importable) describe the interpreter, not its wheel tags.
    """

    implementation: str
    python_version: tuple[int, int, int]
    abi: str
    os: str
    arch: str
    machine: str
    libc: str | None = None
    libc_version: tuple[int, int] | None = None
    executable: str = ""
    has_venv: bool = True

    @property
    def interpreter_tag(self) -> str:
        """``cp311`` style: implementation abbreviation and major+minor version."""
        major, minor = self.python_version[:2]
        return f"{_IMPL_TAGS.get(self.implementation, self.implementation)}{major}{minor}"

    def platform_tags(self) -> tuple[str, ...]:
        """Wheel platform tags this interpreter accepts, most specific first."""
        if self.os != "linux":
            raise EnvironmentSetupError(
                f"packed environments need a Linux cluster; the login node's Python reports "
                f"platform {self.os!r}. Use pre_deployed_env_path instead."
            )
        tags: list[str] = []
        if self.libc == "glibc" and self.libc_version is not None:
            tags.extend(manylinux_tags(self.libc_version, self.arch))
        elif self.libc == "musl" and self.libc_version is not None:
            tags.extend(musllinux_tags(self.libc_version, self.arch))
        tags.append(f"linux_{self.arch}")
        return tuple(tags)

    def pip_target_args(self) -> list[str]:
        """Arguments that make ``pip download`` pick wheels for this interpreter."""
        major, minor = self.python_version[:2]
        impl = _IMPL_TAGS.get(self.implementation)
        if impl is None:
            raise EnvironmentSetupError(
                f"cannot select wheels for Python implementation {self.implementation!r}"
            )
        args = ["--implementation", impl, "--python-version", f"{major}.{minor}"]
        args += ["--abi", self.abi]
        for tag in self.platform_tags():
            args += ["--platform", tag]
        return args

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker variables of this interpreter (for evaluating ``Requires-Dist``)."""
        full = ".".join(str(part) for part in self.python_version)
        return {
            "implementation_name": self.implementation,
            "implementation_version": full,
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_python_implementation": _IMPL_NAMES.get(
                self.implementation, self.implementation
            ),
            "platform_release": "",
            "platform_system": self.os.capitalize(),
            "platform_version": "",
            "python_full_version": full,
            "python_version": ".".join(str(part) for part in self.python_version[:2]),
            "sys_platform": self.os,
        }

    def key(self) -> str:
        """A short stable id of what decides wheel choice (not the micro version or path)."""
        ident = {
            "implementation": self.implementation,
            "python": list(self.python_version[:2]),
            "abi": self.abi,
            "os": self.os,
            "arch": self.arch,
            "libc": self.libc,
            "libc_version": list(self.libc_version) if self.libc_version else None,
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """Human-readable summary for logs, e.g. ``cp311/cp311 linux x86_64 glibc 2.36``."""
        libc = f" {self.libc} {'.'.join(map(str, self.libc_version))}" if self.libc_version else ""
        return f"{self.interpreter_tag}/{self.abi} {self.os} {self.arch}{libc}"


def manylinux_tags(glibc: tuple[int, int], arch: str) -> list[str]:
    """``manylinux_2_<m>_<arch>`` for every m from the glibc's minor down to the oldest
    defined for ``arch``, each followed by its legacy alias (manylinux2014/2010/1)."""
    major, minor = glibc
    if major != 2:
        return []
    oldest = _OLDEST_GLIBC_MINOR.get(arch, _DEFAULT_OLDEST_GLIBC_MINOR)
    tags: list[str] = []
    for m in range(minor, oldest - 1, -1):
        tags.append(f"manylinux_2_{m}_{arch}")
        legacy = _LEGACY_MANYLINUX.get(m)
        if legacy is not None and arch in legacy[1]:
            tags.append(f"{legacy[0]}_{arch}")
    return tags


def musllinux_tags(musl: tuple[int, int], arch: str) -> list[str]:
    """``musllinux_<major>_<m>_<arch>`` for every m from the musl minor down to 0."""
    major, minor = musl
    return [f"musllinux_{major}_{m}_{arch}" for m in range(minor, -1, -1)]


def parse_probe(data: Mapping[str, Any]) -> PythonPlatform:
    """The :class:`PythonPlatform` described by the probe's JSON object."""
    try:
        version = tuple(int(part) for part in data["python_version"])
        implementation = str(data["implementation"])
        plat = str(data["platform"])
        machine = str(data.get("machine") or "")
        bits = int(data.get("pointer_bits") or 64)
    except (KeyError, TypeError, ValueError) as exc:
        raise EnvironmentSetupError(
            f"unreadable platform probe answer {dict(data)!r}: {exc}"
        ) from None
    if len(version) != 3:
        raise EnvironmentSetupError(f"unreadable python_version in probe answer: {version!r}")
    os_name, _, arch = plat.partition("-")
    if os_name == "linux":
        arch = arch.replace("-", "_").replace(".", "_") or machine
        if bits == 32:
            arch = _ARCH_32BIT.get(arch, arch)
    libc, libc_version = _libc(data)
    return PythonPlatform(
        implementation=implementation,
        python_version=(version[0], version[1], version[2]),
        abi=_abi_tag(implementation, version, str(data.get("abiflags") or ""), data.get("soabi")),
        os=os_name,
        arch=arch,
        machine=machine or arch,
        libc=libc,
        libc_version=libc_version,
        executable=str(data.get("executable") or ""),
        has_venv=bool(data.get("has_venv", True)),
    )


def _abi_tag(implementation: str, version: tuple[int, ...], abiflags: str, soabi: Any) -> str:
    if implementation == "cpython":
        return f"cp{version[0]}{version[1]}{abiflags}"
    if isinstance(soabi, str) and soabi:
        return soabi.replace("-", "_").replace(".", "_")
    return "none"


def _libc(data: Mapping[str, Any]) -> tuple[str | None, tuple[int, int] | None]:
    for name in ("glibc", "musl"):
        value = data.get(name)
        if isinstance(value, str) and value:
            parts = value.split(".")
            try:
                return name, (int(parts[0]), int(parts[1]))
            except (IndexError, ValueError):
                raise EnvironmentSetupError(f"unreadable {name} version {value!r}") from None
    return None, None


def local_builds_fit(local: PythonPlatform, cluster: PythonPlatform) -> bool:
    """True when wheels pip picks or builds for ``local`` also install and run on ``cluster``.

    Same implementation, Python major.minor, ABI, OS, architecture and libc family, and the
    local libc is not newer than the cluster's (binaries built here need at most it).
    """
    same = (
        local.implementation == cluster.implementation
        and local.python_version[:2] == cluster.python_version[:2]
        and local.abi == cluster.abi
        and local.os == cluster.os
        and local.arch == cluster.arch
        and local.libc == cluster.libc
    )
    if not same:
        return False
    if local.libc_version is None or cluster.libc_version is None:
        return local.libc_version == cluster.libc_version
    return local.libc_version <= cluster.libc_version


def probe_source() -> str:
    """The text of the probe program (:mod:`~dagster_slurm.environment.cluster.remote_probe`)."""
    package = resources.files("dagster_slurm.environment.cluster")
    return package.joinpath("remote_probe.py").read_text()


def local_platform() -> PythonPlatform:
    """This interpreter's platform, described by the same code the cluster runs."""
    from dagster_slurm.environment.cluster import remote_probe

    return parse_probe(remote_probe.describe())


def probe_cluster(
    agent: AgentClient, python: str | None = None, timeout: float = 60.0
) -> PythonPlatform:
    """The platform of ``python`` (default: the agent's interpreter) on the login node.

    One agent round trip. Raises :class:`EnvironmentSetupError` when the interpreter does
    not run or answers something unreadable.
    """
    from dagster_slurm.agent.ops import exec_op

    interpreter = python or agent.python
    result = agent.run(exec_op([interpreter, "-I", "-c", probe_source()], timeout=timeout))
    if not result.ok:
        raise EnvironmentSetupError(
            f"could not run {interpreter!r} on the login node to learn its platform "
            f"(exit {result.rc}): {result.stderr.strip()[-1000:]}"
        )
    try:
        data = json.loads(result.stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise EnvironmentSetupError(
            f"{interpreter!r} on the login node answered the platform probe with "
            f"{result.stdout[-500:]!r}"
        )
    return parse_probe(data)
