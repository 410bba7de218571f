"""System packages the development cluster needs, and their installation with apt.

:func:`missing_packages` looks for the programs each package provides (and asks dpkg
for packages without a program of their own); :func:`ensure_packages` runs
``apt-get update`` once and ``apt-get install`` only when something is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from dagster_slurm.devcluster.errors import InstallError
from dagster_slurm.devcluster.processes import SYSTEM_PATH

#: Debian package -> programs (names or absolute paths) that prove it is installed.
#: A package with no program listed is checked with dpkg-query.
REQUIRED_PACKAGES: dict[str, tuple[str, ...]] = {
    "slurm-wlm": ("slurmctld", "slurmd", "sinfo", "sbatch", "srun", "scontrol", "sacct"),
    "slurmdbd": ("slurmdbd",),
    "munge": ("munged", "munge", "unmunge", "mungekey"),
    "mariadb-server": ("mariadbd", "mariadb-install-db", "mariadb-admin", "mariadb"),
    "openssh-server": ("sshd", "ssh-keygen"),
    # One-time codes (TOTP) for the login site that asks for a second factor.
    "libpam-oath": (),
    "python3": ("/usr/bin/python3",),
    "python3-venv": (),
    # Compute-node tools the launchers and tests rely on (port checks, process listings).
    "iproute2": ("ss", "ip"),
    "procps": ("ps", "pgrep"),
    "util-linux": ("flock", "unshare", "nsenter", "setsid"),
    # A Java runtime for SparkLauncher's master, workers and drivers (Spark 3.5 runs on
    # Java 8, 11 and 17; 17 is Debian 12's). Any 'java' already on PATH counts.
    "openjdk-17-jre-headless": ("java",),
}

_POLICY_RC = Path("/usr/sbin/policy-rc.d")
# Keeps package scripts from starting system-wide services while installing.
_POLICY_RC_TEXT = "#!/bin/sh\nexit 101\n"


def _program_present(program: str) -> bool:
    if program.startswith("/"):
        return os.access(program, os.X_OK)
    return shutil.which(program, path=SYSTEM_PATH) is not None


def _dpkg_installed(package: str) -> bool:
    dpkg_query = shutil.which("dpkg-query", path=SYSTEM_PATH)
    if dpkg_query is None:
        return False
    proc = subprocess.run(
        [dpkg_query, "-W", "-f=${Status}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode == 0 and proc.stdout.strip() == "install ok installed"


#: Needed besides :data:`REQUIRED_PACKAGES` to build the root of another Slurm release.
ROOT_BUILD_PACKAGES: dict[str, tuple[str, ...]] = {"debootstrap": ("debootstrap",)}


def missing_packages(required: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """Packages of ``required`` (default :data:`REQUIRED_PACKAGES`) that are not installed,
    in table order."""
    missing = []
    for package, programs in (required or REQUIRED_PACKAGES).items():
        present = all(map(_program_present, programs)) if programs else _dpkg_installed(package)
        if not present:
            missing.append(package)
    return missing


def install_hint() -> str:
    """The command a user can run to install everything by hand."""
    return "apt-get install -y --no-install-recommends " + " ".join(REQUIRED_PACKAGES)


def ensure_packages(
    progress: Callable[[str], None] = lambda _msg: None,
    required: dict[str, tuple[str, ...]] | None = None,
) -> list[str]:
    """Install missing packages with apt; return the ones that were installed.

    Raises :class:`InstallError` when apt is not available or fails, or when packages are
    still missing afterwards.
    """
    missing = missing_packages(required)
    if not missing:
        return []
    apt_get = shutil.which("apt-get", path=SYSTEM_PATH)
    if apt_get is None:
        raise InstallError(f"missing packages {missing} and no apt-get to install them")
    progress(f"installing {' '.join(missing)} with apt-get (takes a minute)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "PATH": SYSTEM_PATH}
    added_policy = _deny_service_starts()
    try:
        for argv in (
            [apt_get, "update"],
            [apt_get, "install", "-y", "--no-install-recommends", *missing],
        ):
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                output = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                raise InstallError(f"{' '.join(argv)} exited with {proc.returncode}:\n{output}")
    finally:
        if added_policy:
            _POLICY_RC.unlink(missing_ok=True)
    still = missing_packages(required)
    if still:
        raise InstallError(f"packages still missing after apt-get install: {still}")
    return missing


def _deny_service_starts() -> bool:
    """Create a policy-rc.d that forbids service starts unless one exists; True if created."""
    if _POLICY_RC.exists():
        return False
    _POLICY_RC.write_text(_POLICY_RC_TEXT)
    _POLICY_RC.chmod(0o755)
    return True
