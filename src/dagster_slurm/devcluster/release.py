"""A second Slurm release for the development cluster: a Debian root of another suite.

The machine's own packages give one Slurm release (Debian 12: 22.05, Debian 13: 24.11).
``up --slurm-release`` with the other one builds a root file system of the Debian suite
that packages it (``debootstrap --variant=minbase`` plus ``apt-get install`` inside it),
cached in :data:`ROOTS_DIR` and rebuilt only when missing or incomplete, and runs the
cluster's Slurm daemons, its login node and its Slurm client commands chrooted into it.

Inside the root, :data:`ROOT_SHIM` bind-mounts what a process of the cluster needs from
the machine (``/proc``, ``/sys``, ``/dev``, ``/tmp``, ``/home``, the state directory,
``/etc/hosts`` and the account files, and read-only the payload environments with their
interpreters) before ``chroot``. The mounts are made in a private mount namespace (the
node's own, or one of its own for the controller, slurmdbd and client commands), so the
cached root itself never shows them. munged and MariaDB stay the machine's: the Slurm
daemons only talk to them over a socket.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from dagster_slurm.devcluster.errors import DevClusterError, InstallError
from dagster_slurm.devcluster.processes import SYSTEM_PATH

#: Environment variable that chooses the Slurm release of the cluster (see :data:`SUITES`).
RELEASE_ENV = "DAGSTER_SLURM_DEV_SLURM_RELEASE"
#: Slurm release -> the Debian suite whose ``slurm-wlm`` package is that release.
SUITES: dict[str, str] = {"22.05": "bookworm", "24.11": "trixie"}
#: Major Debian version (``/etc/debian_version``) -> suite name.
DEBIAN_VERSIONS: dict[str, str] = {"12": "bookworm", "13": "trixie"}
#: Where the roots are cached, one directory per suite (outside any state directory, so
#: every cluster of the machine and every later ``up`` shares it).
ROOTS_DIR = Path("/var/cache/dagster-slurm/roots")
MIRROR = "http://deb.debian.org/debian"
#: Packages installed into a root: Slurm and its daemons, sshd for the login node, the
#: login node's python3 (the library's agent), the tools launchers use on the nodes, and
#: the shared libraries a payload interpreter built on the machine links against
#: (``ldd`` of a pyenv CPython and its ``lib-dynload`` modules), in both suites' names.
BASE_PACKAGES: tuple[str, ...] = (
    "slurm-wlm", "slurmdbd", "slurm-client", "munge", "openssh-server",
    "python3", "python3-venv", "iproute2", "procps", "util-linux",
    "libffi8", "libsqlite3-0", "libbz2-1.0", "liblzma5", "zlib1g", "libncursesw6",
    "libexpat1", "libuuid1", "libnsl2", "libcrypt1",
)
#: Libraries whose package names differ between the suites (the 64-bit time_t rename).
SUITE_PACKAGES: dict[str, tuple[str, ...]] = {
    "bookworm": ("libssl3", "libreadline8", "libtirpc3", "libgdbm6"),
    "trixie": ("libssl3t64", "libreadline8t64", "libtirpc3t64", "libgdbm6t64"),
}
#: Programs a complete root has (checked besides the marker file).
ROOT_PROGRAMS: tuple[str, ...] = (
    "usr/sbin/slurmctld", "usr/sbin/slurmd", "usr/sbin/slurmdbd", "usr/sbin/slurmstepd",
    "usr/bin/sinfo", "usr/bin/sbatch", "usr/bin/srun", "usr/bin/sacct",
    "usr/sbin/sshd", "usr/bin/python3", "usr/bin/ps", "usr/bin/ss",
)
#: Written into a root as its last build step; holds the suite and the package list.
MARKER = ".dagster-slurm-root.json"
#: Slurm client commands the cluster offers as wrappers (``<state dir>/bin``).
CLIENT_COMMANDS: tuple[str, ...] = (
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
    "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger",
)

#: Runs in a private mount namespace: bind-mount each ``KIND:PATH`` argument into the
#: root at the same path (``rw``/``ro``: a directory, recursively, ``ro`` then remounted
#: read-only; ``file``: a single file), then become ``argv`` chrooted into the root.
#: Arguments: root, mount specs, ``--``, argv.
ROOT_SHIM = (
    'root=$1; shift; while [ "$#" -gt 0 ] && [ "$1" != -- ]; do'
    ' kind=${1%%:*}; src=${1#*:}; dst=$root$src; shift;'
    ' case $kind in'
    ' file) { [ -e "$dst" ] || : > "$dst"; } && mount --bind "$src" "$dst" ;;'
    ' ro) mkdir -p "$dst" && mount --rbind "$src" "$dst" && mount -o remount,bind,ro "$dst" ;;'
    ' rw) mkdir -p "$dst" && mount --rbind "$src" "$dst" ;;'
    ' *) echo "root-shim: unknown mount kind $kind" >&2; false ;;'
    ' esac || exit 1; done; shift; exec chroot "$root" "$@"'
)


def release_suite(release: str) -> str:
    """The Debian suite packaging Slurm ``release``; :class:`DevClusterError` if unknown."""
    try:
        return SUITES[release]
    except KeyError:
        raise DevClusterError(
            f"unknown Slurm release {release!r}: choose from {', '.join(SUITES)} "
            f"(or 'native' for the machine's own)"
        ) from None


def parse_release(text: str | None) -> str:
    """A release name from user input: ``''`` for the machine's own (``native``, empty)."""
    word = (text or "").strip().lower()
    if word in ("", "native", "host"):
        return ""
    release_suite(word)
    return word


def host_suite(
    os_release: Path = Path("/etc/os-release"), debian_version: Path = Path("/etc/debian_version")
) -> str | None:
    """This machine's Debian suite (``bookworm``...), None when it is not a known Debian."""
    try:
        match = re.search(r"^VERSION_CODENAME=\"?(\w+)", os_release.read_text(), re.MULTILINE)
    except OSError:
        match = None
    if match and match.group(1) in SUITES.values():
        return match.group(1)
    try:
        major = debian_version.read_text().strip().split(".")[0]
    except OSError:
        return None
    return DEBIAN_VERSIONS.get(major)


def root_for(release: str, machine_suite: str | None, roots_dir: Path = ROOTS_DIR) -> Path | None:
    """The root to run ``release`` from, None when the machine's own packages are that
    release (or no release was chosen)."""
    if not release:
        return None
    suite = release_suite(release)
    return None if suite == machine_suite else roots_dir / suite


def root_packages(suite: str) -> tuple[str, ...]:
    """Every package installed into a root of ``suite``."""
    return (*BASE_PACKAGES, *SUITE_PACKAGES[suite])


def debootstrap_argv(suite: str, target: Path, mirror: str = MIRROR) -> list[str]:
    """The command creating a minimal root of ``suite`` in ``target``."""
    return ["debootstrap", "--variant=minbase", suite, str(target), mirror]


def install_argv(target: Path, packages: Sequence[str]) -> list[str]:
    """The command installing ``packages`` into the root ``target`` (no recommends)."""
    return ["chroot", str(target), "apt-get", "install", "-y", "--no-install-recommends",
            *packages]


def root_complete(root: Path, suite: str) -> bool:
    """True when ``root`` was built to the end for the current package list."""
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("suite") != suite:
        return False
    if marker.get("packages") != list(root_packages(suite)):
        return False
    return all(os.access(root / program, os.X_OK) for program in ROOT_PROGRAMS)


@dataclass(frozen=True)
class BuildStep:
    """One command of a root build and what it is for (for errors and progress)."""

    what: str
    argv: list[str]


def build_steps(suite: str, target: Path, mirror: str = MIRROR) -> list[BuildStep]:
    """The commands building a root of ``suite`` in ``target`` (an empty directory)."""
    return [
        BuildStep("debootstrap", debootstrap_argv(suite, target, mirror)),
        BuildStep("apt-get update", ["chroot", str(target), "apt-get", "update"]),
        BuildStep("apt-get install", install_argv(target, root_packages(suite))),
    ]


_POLICY_RC_TEXT = "#!/bin/sh\nexit 101\n"
_APT_ENV = {
    "DEBIAN_FRONTEND": "noninteractive",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
}


def ensure_root(
    root: Path, suite: str, progress: Callable[[str], None] = lambda _line: None,
    runner: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
) -> str:
    """Build the root ``root`` of ``suite`` unless it is complete; return what was done.

    The build runs in ``<root>.building`` and is renamed into place at the end, under a
    lock shared by every cluster of the machine, so an interrupted build is never taken
    for a complete root. Raises :class:`InstallError` naming the step that failed.
    """
    if root_complete(root, suite):
        return f"{root} present"
    run = runner or _run
    if run(["sh", "-c", "command -v debootstrap"]).returncode != 0:
        raise InstallError(
            "debootstrap is needed to build the root of another Slurm release: "
            "apt-get install debootstrap"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root_complete(root, suite):
            return f"{root} present (built meanwhile)"
        began = time.monotonic()
        building = root.with_name(f"{root.name}.building")
        shutil.rmtree(building, ignore_errors=True)
        progress(f"building a Debian {suite} root in {root} (a few minutes)")
        for step in build_steps(suite, building):
            if step.what == "apt-get update":
                _deny_service_starts(building)
            proc = run(step.argv)
            if proc.returncode != 0:
                output = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                raise InstallError(
                    f"building the {suite} root: {step.what} ({shlex.join(step.argv)}) "
                    f"exited with {proc.returncode}:\n{output}"
                )
        (building / "run" / "sshd").mkdir(parents=True, exist_ok=True)
        marker = {"suite": suite, "packages": list(root_packages(suite))}
        (building / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _set_aside(root)
        building.rename(root)
        took = time.monotonic() - began
        if not root_complete(root, suite):
            raise InstallError(f"the {suite} root in {root} is incomplete after its build")
        return f"built {root} in {took:.0f} s"


def _set_aside(root: Path) -> None:
    """Move an outdated ``root`` out of the way instead of deleting it: daemons of a running
    cluster may still be chrooted into it (they keep it by inode). Roots set aside by an
    earlier build are removed."""
    for old in root.parent.glob(f"{root.name}.replaced-*"):
        shutil.rmtree(old, ignore_errors=True)
    if root.exists():
        root.rename(root.with_name(f"{root.name}.replaced-{int(time.time())}"))


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=_APT_ENV, capture_output=True, text=True, check=False,
                          timeout=1800)


def _deny_service_starts(root: Path) -> None:
    policy = root / "usr" / "sbin" / "policy-rc.d"
    policy.write_text(_POLICY_RC_TEXT)
    policy.chmod(0o755)


def slurm_version(root: Path | None) -> str:
    """The ``slurm-wlm`` package version of ``root`` (the machine's own for None)."""
    status = (root or Path("/")) / "var" / "lib" / "dpkg" / "status"
    try:
        text = status.read_text()
    except OSError:
        return ""
    match = re.search(r"^Package: slurm-wlm\n(?:[^\n]+\n)*?Version: (\S+)", text, re.MULTILINE)
    return match.group(1) if match else ""


# -- running in a root ------------------------------------------------------------------

#: Directories of the machine every process in a root sees at the same path.
SHARED_DIRS: tuple[str, ...] = ("/proc", "/sys", "/dev", "/tmp", "/home")
#: Files of the machine every process in a root sees (node names, the same accounts).
SHARED_FILES: tuple[str, ...] = ("/etc/hosts", "/etc/passwd", "/etc/group", "/etc/shadow")


def root_mounts(state_dir: Path, payload_paths: Iterable[str] = ()) -> list[str]:
    """The mount specs of :data:`ROOT_SHIM`: shared directories, the state directory,
    shared files, then ``payload_paths`` read-only (nested paths after their parents)."""
    specs = [f"rw:{path}" for path in SHARED_DIRS]
    if not any(_below(state_dir, Path(path)) for path in SHARED_DIRS):
        specs.append(f"rw:{state_dir}")
    specs += [f"file:{path}" for path in SHARED_FILES]
    specs += [f"ro:{path}" for path in sorted(set(payload_paths), key=lambda p: (len(p), p))
              if not any(_below(Path(path), Path(d)) for d in SHARED_DIRS)]
    return specs


def _below(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def in_root(root: Path, mounts: Sequence[str], argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` chrooted into ``root`` after ``mounts``; must run in a private mount
    namespace already (a node's)."""
    return ("/bin/sh", "-c", ROOT_SHIM, "root-shim", str(root), *mounts, "--", *argv)


def in_root_namespace(
    root: Path, mounts: Sequence[str], argv: Sequence[str], unshare: str = "unshare"
) -> tuple[str, ...]:
    """``argv`` chrooted into ``root`` in a mount namespace of its own."""
    return (unshare, "--mount", "--propagation", "private", *in_root(root, mounts, argv))


def slurm_side(
    root: Path | None, mounts: Sequence[str], argv: Sequence[str], in_node: bool = False
) -> tuple[str, ...]:
    """``argv`` of a program of a cluster's Slurm release: as is with the machine's own
    packages (``root`` None), else chrooted into ``root`` after ``mounts``, in the node's
    mount namespace when ``in_node``, else in a mount namespace of its own."""
    if root is None:
        return tuple(argv)
    if in_node:
        return in_root(root, mounts, argv)
    unshare = shutil.which("unshare", path=SYSTEM_PATH) or "unshare"
    return in_root_namespace(root, mounts, argv, unshare)


def payload_paths(environ: Mapping[str, str], names: Sequence[str]) -> tuple[str, ...]:
    """Directories a job in a root needs from the machine for the payload environments
    named by the variables ``names`` of ``environ``: each environment directory and the
    installation prefix of its interpreter (where ``bin/python`` really lives)."""
    found: list[str] = []
    for name in names:
        value = environ.get(name, "").strip()
        if not value:
            continue
        env_dir = Path(value)
        found.append(str(env_dir))
        python = env_dir / "bin" / "python"
        if python.exists():
            prefix = python.resolve().parent.parent
            if not _below(prefix, env_dir):
                found.append(str(prefix))
    return tuple(dict.fromkeys(found))


def client_script(command: str, release: str, root: Path, argv: Sequence[str]) -> str:
    """Text of the wrapper that runs Slurm client ``command`` of ``release`` from ``root``
    (``argv``: the full command line before the user's arguments)."""
    source = resources.files(__package__).joinpath("templates", "slurm-client.sh")
    return Template(source.read_text(encoding="utf-8")).substitute(
        command=shlex.quote(command),
        release=shlex.quote(release),
        root=shlex.quote(str(root)),
        argv=shlex.join(argv),
    )
