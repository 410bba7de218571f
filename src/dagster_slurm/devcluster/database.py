"""MariaDB for slurmdbd: system tables, the ``slurm`` account and its password.

The server runs as root with its own data directory, socket and TCP port on 127.0.0.1;
nothing of a system-wide MariaDB installation is used or touched.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

from dagster_slurm.devcluster.config import render_grants
from dagster_slurm.devcluster.errors import DaemonStartError
from dagster_slurm.devcluster.layout import Paths
from dagster_slurm.devcluster.processes import run


def ensure_password(paths: Paths) -> str:
    """The password of the database account slurmdbd uses, created once (hex, root-only)."""
    try:
        password = paths.mariadb_password.read_text().strip()
    except OSError:
        password = ""
    if not password:
        password = secrets.token_hex(16)
        paths.mariadb_password.parent.mkdir(parents=True, exist_ok=True)
        paths.mariadb_password.write_text(password + "\n")
    os.chmod(paths.mariadb_password, 0o600)
    return password


def _failed(what: str, stdout: str, stderr: str) -> DaemonStartError:
    output = "\n".join((stdout + stderr).splitlines()[-30:])
    return DaemonStartError("mariadb", what, output)


def install_database(paths: Paths, env: Mapping[str, str]) -> bool:
    """Create the system tables unless they exist; True when they were created (~1 s)."""
    datadir = paths.mariadb_data
    if (datadir / "mysql").is_dir():
        return False
    datadir.mkdir(parents=True, exist_ok=True)
    argv = [
        "mariadb-install-db",
        "--no-defaults",
        f"--datadir={datadir}",
        "--user=root",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
    ]
    proc = run(argv, env, timeout=120)
    if proc.returncode != 0:
        raise _failed("mariadb-install-db failed", proc.stdout, proc.stderr)
    return True


def apply_grants(paths: Paths, password: str, env: Mapping[str, str]) -> None:
    """Create or update the ``slurm`` account with rights on ``slurm_acct_db`` only."""
    argv = ["mariadb", "--no-defaults", f"--socket={paths.mariadb_socket}", "--user=root"]
    proc = run(argv, env, input_text=render_grants(password), timeout=30)
    if proc.returncode != 0:
        raise _failed("creating the slurm database account failed", proc.stdout, proc.stderr)
