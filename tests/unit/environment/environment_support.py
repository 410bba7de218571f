"""Shared code of the environment tests: tiny wheels, a fake pip, platforms."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from dagster_slurm.environment.cluster.platform import PythonPlatform
from dagster_slurm.environment.packing.pip import PipResult

#: A glibc x86_64 CPython 3.11, as the dev cluster reports it.
CLUSTER = PythonPlatform(
    implementation="cpython",
    python_version=(3, 11, 2),
    abi="cp311",
    os="linux",
    arch="x86_64",
    machine="x86_64",
    libc="glibc",
    libc_version=(2, 36),
    executable="/usr/bin/python3",
)


def make_wheel(
    directory: Path, name: str, version: str, tag: str = "py3-none-any", salt: str = ""
) -> Path:
    """A minimal valid wheel of one module ``name`` (underscored); same arguments, same bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    module = re.sub(r"[-.]+", "_", name).lower()
    dist_info = f"{module}-{version}.dist-info"
    path = directory / f"{module}-{version}-{tag}.whl"
    members = {
        f"{module}/__init__.py": f"VERSION = {version!r}\nSALT = {salt!r}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    members[f"{dist_info}/RECORD"] = "".join(f"{n},,\n" for n in [*members, f"{dist_info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in members.items():
            archive.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), text)
    return path


class FakePip:
    """Stands in for ``python -m pip``: writes a wheel per requested requirement.

    ``versions``: the version served for an unpinned name; ``no_wheel``: names for which
    ``pip download`` reports "No matching distribution"; ``impure``: names built with a
    platform tag; ``sources``: local path -> (name, version) for ``pip wheel <path>``;
    ``salt`` changes the wheels' content (as a rebuilt release would).
    """

    def __init__(
        self,
        versions: Mapping[str, str] | None = None,
        no_wheel: Sequence[str] = (),
        impure: Sequence[str] = (),
        sources: Mapping[str, tuple[str, str]] | None = None,
        salt: str = "",
    ) -> None:
        self.salt = salt
        self.versions = dict(versions or {})
        self.no_wheel = set(no_wheel)
        self.impure = set(impure)
        self.sources = dict(sources or {})
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.requested: list[list[str]] = []

    def __call__(self, args: Sequence[str], env: Mapping[str, str]) -> PipResult:
        args = list(args)
        self.calls.append((args, dict(env)))
        command = args[0]
        dest = Path(args[args.index("--dest" if command == "download" else "--wheel-dir") + 1])
        requirements = self._requirements(args)
        self.requested.append(requirements)
        for requirement in requirements:
            if requirement in self.sources:
                name, version = self.sources[requirement]
            else:
                name, _, version = requirement.partition("==")
                version = version or self.versions.get(name, "1.0")
            if command == "download" and name in self.no_wheel:
                return PipResult(
                    tuple(args), 1, "", f"ERROR: No matching distribution found for {requirement}\n"
                )
            tag = "cp311-cp311-linux_x86_64" if name in self.impure else "py3-none-any"
            make_wheel(dest, name, version, tag, self.salt)
        return PipResult(tuple(args), 0, "", "")

    def commands(self) -> list[str]:
        return [args[0] for args, _ in self.calls]

    @staticmethod
    def _requirements(args: list[str]) -> list[str]:
        if "-r" in args:
            text = Path(args[args.index("-r") + 1]).read_text()
            return [line.strip() for line in text.splitlines() if line.strip()]
        return [args[-1]]
