"""Which distributions go into a packed environment (pure policy, plus one metadata reader).

From the current environment (``env_packages=None``): every installed distribution, pinned to
its installed version, except the build and development tools of :data:`EXCLUDED_NAMES` /
:data:`EXCLUDED_PREFIXES` (:func:`is_excluded`). An excluded tool that a kept distribution
requires (for the cluster's marker environment, without extras) is kept after all, with
whatever it requires in turn. Distributions installed from a local directory, a local
archive or a VCS checkout (PEP 610 ``direct_url.json``; the editable install of the project
itself) cannot be downloaded: they become :class:`LocalSource` entries, built here with
``pip wheel``.

From a list (``env_packages=[...]``): the given requirement strings, resolved with their
dependencies for the cluster; ``dagster-pipes`` is added (pinned to the local version when
installed) unless the list names it, because the payload calls ``open_dagster_pipes()``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from dagster_slurm.environment.errors import EnvironmentSetupError

PIPES = "dagster-pipes"

#: Build, packaging, test, lint and documentation tools: not needed to run a payload.
EXCLUDED_NAMES = frozenset(
    {
        "pip",
        "setuptools",
        "wheel",
        "distribute",
        "build",
        "twine",
        "virtualenv",
        "pipx",
        "uv",
        "pip-tools",
        "pytest",
        "hypothesis",
        "coverage",
        "tox",
        "nox",
        "pre-commit",
        "ruff",
        "mypy",
        "black",
        "isort",
        "flake8",
        "pylint",
        "pyright",
        "mkdocs",
    }
)
#: Name prefixes of tool families excluded as a whole (plugins, themes, stubs).
EXCLUDED_PREFIXES = ("pytest-", "mkdocs-", "mkdocstrings", "flake8-", "sphinx", "types-")


@dataclass(frozen=True)
class DirectUrl:
    """PEP 610 origin of a distribution not installed from an index."""

    url: str
    kind: str  # "dir", "archive" or "vcs"
    editable: bool = False
    vcs: str | None = None
    commit: str | None = None
    subdirectory: str | None = None

    def source_spec(self) -> str:
        """What to give ``pip wheel`` to rebuild the distribution: a local path or a URL."""
        if self.kind == "vcs":
            spec = f"{self.vcs}+{self.url}" + (f"@{self.commit}" if self.commit else "")
        elif self.url.startswith("file:"):
            spec = unquote(urlsplit(self.url).path)
            if self.subdirectory:
                return f"{spec.rstrip('/')}/{self.subdirectory}"
            return spec
        else:
            spec = self.url
        return spec + (f"#subdirectory={self.subdirectory}" if self.subdirectory else "")

    @property
    def local_path(self) -> str | None:
        """The local directory or archive, for ``file:`` URLs."""
        return self.source_spec() if self.kind != "vcs" and self.url.startswith("file:") else None


@dataclass(frozen=True)
class InstalledDistribution:
    """One installed distribution: canonical name, version, ``Requires-Dist``, origin."""

    name: str
    version: str
    requires: tuple[str, ...] = ()
    direct_url: DirectUrl | None = None


@dataclass(frozen=True)
class Pin:
    """``name==version``, downloaded from the configured package index."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class LocalSource:
    """A distribution rebuilt here as a wheel from ``origin``."""

    name: str
    version: str
    origin: DirectUrl


@dataclass(frozen=True)
class EnvironmentSelection:
    """The outcome of :func:`select_from_environment`."""

    pins: tuple[Pin, ...]
    local: tuple[LocalSource, ...]
    excluded: tuple[str, ...]


def parse_direct_url(text: str | None) -> DirectUrl | None:
    """The origin recorded in ``direct_url.json``; None when absent or unreadable."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return None
    subdirectory = data.get("subdirectory") if isinstance(data.get("subdirectory"), str) else None
    if isinstance(data.get("vcs_info"), dict):
        info = data["vcs_info"]
        return DirectUrl(
            data["url"],
            "vcs",
            vcs=str(info.get("vcs") or "git"),
            commit=info.get("commit_id"),
            subdirectory=subdirectory,
        )
    if isinstance(data.get("dir_info"), dict):
        editable = bool(data["dir_info"].get("editable"))
        return DirectUrl(data["url"], "dir", editable=editable, subdirectory=subdirectory)
    return DirectUrl(data["url"], "archive", subdirectory=subdirectory)


def is_excluded(name: str) -> bool:
    """Whether ``name`` is a build/development tool left out of packed environments."""
    canonical = canonicalize_name(name)
    return canonical in EXCLUDED_NAMES or canonical.startswith(EXCLUDED_PREFIXES)


def select_from_environment(
    distributions: Iterable[InstalledDistribution], markers: Mapping[str, str]
) -> EnvironmentSelection:
    """Pins and local sources for the current environment (see the module docstring).

    ``distributions`` in ``sys.path`` order: the first of a name wins, as for imports.
    ``markers`` is the cluster's marker environment.
    """
    by_name: dict[str, InstalledDistribution] = {}
    for dist in distributions:
        by_name.setdefault(canonicalize_name(dist.name), dist)
    if PIPES not in by_name:
        raise EnvironmentSetupError(
            "dagster-pipes is not installed in this Python environment, but the payload "
            "imports it: install it here, or list the packages in env_packages"
        )
    kept = {name for name in by_name if not is_excluded(name)}
    kept |= _required_closure(by_name, kept, markers)
    pins: list[Pin] = []
    local: list[LocalSource] = []
    for name in sorted(kept):
        dist = by_name[name]
        if dist.direct_url is not None:
            local.append(LocalSource(name, dist.version, dist.direct_url))
        else:
            pins.append(Pin(name, dist.version))
    excluded = tuple(sorted(set(by_name) - kept))
    return EnvironmentSelection(tuple(pins), tuple(local), excluded)


def _required_closure(
    by_name: Mapping[str, InstalledDistribution], kept: set[str], markers: Mapping[str, str]
) -> set[str]:
    """Installed distributions outside ``kept`` that ``kept`` ones require, transitively."""
    added: set[str] = set()
    todo = list(kept)
    while todo:
        dist = by_name[todo.pop()]
        for name in requirement_names(dist.requires, markers):
            if name in by_name and name not in kept and name not in added:
                added.add(name)
                todo.append(name)
    return added


def requirement_names(requires: Sequence[str], markers: Mapping[str, str]) -> list[str]:
    """Canonical names of the ``Requires-Dist`` entries that apply (no extras selected)."""
    names = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({**markers, "extra": ""}):
            continue
        names.append(str(canonicalize_name(req.name)))
    return names


def requirements_with_pipes(
    requirements: Sequence[str], local_pipes_version: str | None
) -> tuple[str, ...]:
    """The user's requirement strings, checked, plus ``dagster-pipes`` unless listed."""
    names = set()
    for text in requirements:
        try:
            names.add(canonicalize_name(Requirement(text).name))
        except InvalidRequirement as exc:
            raise EnvironmentSetupError(
                f"env_packages entry {text!r} is not a requirement: {exc}"
            ) from None
    if PIPES in names:
        return tuple(requirements)
    pipes = f"{PIPES}=={local_pipes_version}" if local_pipes_version else PIPES
    return (*requirements, pipes)


def installed_distributions() -> list[InstalledDistribution]:
    """The distributions of the running interpreter's environment, in ``sys.path`` order."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        found.append(
            InstalledDistribution(
                canonicalize_name(name),
                dist.version,
                tuple(dist.requires or ()),
                parse_direct_url(dist.read_text("direct_url.json")),
            )
        )
    return found
