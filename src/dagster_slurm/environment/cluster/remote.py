"""Where packed environments live on the cluster and the commands that install them (pure).

Layout under ``<base>/envs``::

    <hash>                      symlink to .builds/<hash>.<token>, created atomically last
    .builds/<hash>.<token>/     one build: the uploaded files, then
        wheels/ requirements.txt venv/ activate.sh -> venv/bin/activate   (wheelhouse)
        environment.sh env/ activate.sh                                      (pixi)
        .ready                  written after a successful install, before publishing
    .builds/<hash>.lease.json   who is building <hash> (a lease with an expiry)
    .builds/<hash>.lock         the lock directory of that document
    .wheels/<sha256>/<file>     wheels already on the cluster, shared by all environments

A build links the wheels the store has (:mod:`~dagster_slurm.environment.cluster.remote_wheels`)
and uploads only the others; after pip verified and installed them they join the store. So
an environment that differs from an earlier one by one wheel (the project's own, after a
code change) uploads one wheel.

A build never moves (venvs and conda prefixes hold absolute paths), so it is made in its
final directory and *published* by creating the ``<hash>`` symlink, which fails if another
build got there first. ``<hash>/.ready`` thus exists exactly when a complete environment is
published. Every command is an argv list run by the agent's ``exec`` (no shell).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from dagster_slurm.environment.packing.pixi import unpack_argv

ENVS_DIR = "envs"
BUILDS_DIR = ".builds"
READY = ".ready"
ACTIVATE = "activate.sh"
WHEELS = "wheels"
STORE_DIR = ".wheels"
REQUIREMENTS = "requirements.txt"
#: pip on the cluster ignores configuration files there: everything comes from the upload.
INSTALL_ENV = (("PIP_CONFIG_FILE", "/dev/null"), ("PIP_NO_INPUT", "1"))


@dataclass(frozen=True)
class PackFile:
    """A local file to place at ``name`` (relative) in the build directory.

    ``shared``: a wheel that may come from (and goes to) the cluster's wheel store.
    """

    name: str
    path: Path
    sha256: str
    shared: bool = False

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass(frozen=True)
class Recipe:
    """A packed environment ready to upload: files, generated files and how to install.

    ``kind`` is ``wheelhouse`` or ``pixi``; ``generated`` holds small files made from the
    pack (requirements.txt); ``installer`` is the file name of pip's wheel under ``wheels/``
    (wheelhouse only).
    """

    kind: str
    env_hash: str
    files: tuple[PackFile, ...]
    generated: tuple[tuple[str, bytes], ...] = ()
    installer: str | None = None
    description: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files) + sum(len(data) for _, data in self.generated)

    def shared_pairs(self, files: Sequence[PackFile] | None = None) -> list[list[str]]:
        """``[sha256, file name]`` of the shared files (of ``files``, default all)."""
        chosen = self.files if files is None else files
        return [[f.sha256, f.path.name] for f in chosen if f.shared]


@dataclass(frozen=True)
class InstallStep:
    """One command of an installation; ``required`` False: a failure is only reported."""

    label: str
    argv: tuple[str, ...]
    timeout: float
    required: bool = True
    env: tuple[tuple[str, str], ...] = ()
    stdin: str | None = None


@dataclass(frozen=True)
class RemoteLayout:
    """Paths of environment ``env_hash`` under ``base`` (see the module docstring)."""

    base: str
    env_hash: str

    @property
    def envs_dir(self) -> str:
        return f"{self.base.rstrip('/')}/{ENVS_DIR}"

    @property
    def env_dir(self) -> str:
        """The published environment (a symlink to its build directory)."""
        return f"{self.envs_dir}/{self.env_hash}"

    @property
    def ready_marker(self) -> str:
        return f"{self.env_dir}/{READY}"

    @property
    def activation_script(self) -> str:
        return f"{self.env_dir}/{ACTIVATE}"

    @property
    def builds_dir(self) -> str:
        return f"{self.envs_dir}/{BUILDS_DIR}"

    @property
    def lease_document(self) -> str:
        return f"{self.builds_dir}/{self.env_hash}.lease.json"

    @property
    def lease_lock(self) -> str:
        return f"{self.builds_dir}/{self.env_hash}.lock"

    @property
    def store_dir(self) -> str:
        return f"{self.envs_dir}/{STORE_DIR}"

    def build_dir(self, token: str) -> str:
        return f"{self.builds_dir}/{self.build_name(token)}"

    def build_name(self, token: str) -> str:
        return f"{self.env_hash}.{token}"


def install_steps(
    recipe: Recipe, build_dir: str, python: str, timeout: float
) -> tuple[InstallStep, ...]:
    """The commands that turn an uploaded build directory into an environment."""
    if recipe.kind == "pixi":
        script = f"{build_dir}/{recipe.files[0].name}"
        return (
            InstallStep(
                "unpack the pixi environment", tuple(unpack_argv(script, build_dir)), timeout
            ),
        )
    if recipe.installer is None:
        raise ValueError("a wheelhouse recipe needs its installer wheel")
    venv = f"{build_dir}/venv"
    pip = (f"{venv}/bin/python", f"{build_dir}/{WHEELS}/{recipe.installer}/pip")
    install = (
        *pip,
        "install",
        "--no-index",
        "--no-deps",
        "--require-hashes",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--find-links",
        f"{build_dir}/{WHEELS}",
        "-r",
        f"{build_dir}/{REQUIREMENTS}",
    )
    return (
        InstallStep("create the venv", (python, "-m", "venv", "--without-pip", venv), 300.0),
        InstallStep("install the wheels", install, timeout, env=INSTALL_ENV),
        InstallStep("check dependencies", (*pip, "check"), 300.0, required=False, env=INSTALL_ENV),
        InstallStep(
            "link activate.sh", ("ln", "-s", "venv/bin/activate", f"{build_dir}/{ACTIVATE}"), 30.0
        ),
    )


def wheel_store_step(
    mode: str, layout: RemoteLayout, build_dir: str, python: str, pairs: Sequence[Sequence[str]]
) -> InstallStep:
    """Run the wheel store program: ``link`` cached wheels into the build, or ``store`` the
    build's uploaded wheels; the pairs go on standard input (:func:`wheel_store_input`)."""
    argv = (
        python,
        "-I",
        "-c",
        wheel_store_source(),
        mode,
        layout.store_dir,
        f"{build_dir}/{WHEELS}",
    )
    label = "link cached wheels" if mode == "link" else "add uploaded wheels to the store"
    return InstallStep(label, argv, 300.0, required=mode == "link", stdin=wheel_store_input(pairs))


def wheel_store_input(pairs: Sequence[Sequence[str]]) -> str:
    return json.dumps([list(pair) for pair in pairs])


def wheel_store_source() -> str:
    """The text of :mod:`~dagster_slurm.environment.cluster.remote_wheels`."""
    package = resources.files("dagster_slurm.environment.cluster")
    return package.joinpath("remote_wheels.py").read_text()


def publish_argv(layout: RemoteLayout, token: str) -> tuple[str, ...]:
    """Create the ``<hash>`` symlink (relative); fails when it exists already."""
    return ("ln", "-s", "-n", f"{BUILDS_DIR}/{layout.build_name(token)}", layout.env_dir)


def ready_content(recipe: Recipe, token: str, owner: str) -> str:
    """The ``.ready`` marker: what was installed and by whom."""
    data = {"env_hash": recipe.env_hash, "kind": recipe.kind, "build": token, "owner": owner}
    return json.dumps(data, sort_keys=True) + "\n"
