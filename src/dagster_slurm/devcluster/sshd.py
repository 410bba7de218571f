"""The login node's SSH side: keys, known_hosts and the non-root submitter account.

Jobs reach the cluster the way they would at an HPC site: over SSH, as an ordinary
user whose ``authorized_keys`` holds a generated client key. The private client key and
the known_hosts file stay in the root-only ``ssh`` directory of the state directory.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from dagster_slurm.devcluster.config import write_if_changed
from dagster_slurm.devcluster.errors import DevClusterError
from dagster_slurm.devcluster.layout import Settings
from dagster_slurm.devcluster.processes import daemon_env, run

_SHADOW = Path("/etc/shadow")
#: Directory sshd needs for privilege separation.
PRIVSEP_DIR = Path("/run/sshd")


def _checked(argv: list[str], what: str) -> str:
    proc = run(argv, daemon_env())
    if proc.returncode != 0:
        raise DevClusterError(f"{what} failed ({' '.join(argv)}): {proc.stderr.strip()}")
    return proc.stdout


def ensure_keypair(path: Path, comment: str) -> bool:
    """Create an ed25519 key pair without passphrase at ``path`` unless it exists.

    Returns True when a new pair was generated.
    """
    if path.exists() and path.with_suffix(".pub").exists():
        return False
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    _checked(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        "ssh-keygen",
    )
    return True


def ensure_keys(settings: Settings, direct: list[tuple[str, int]] | None = None) -> None:
    """Host key, client key and a known_hosts file with a ``[127.0.0.1]:PORT`` entry for
    the login node and each chosen login site, and an ``[address]:PORT`` entry for each of
    ``direct`` (login nodes reached without the alias); all of them share the host key."""
    paths = settings.paths
    paths.ssh.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.ssh, 0o700)
    ensure_keypair(paths.host_key, "dagster-slurm-dev-host")
    ensure_keypair(paths.client_key, "dagster-slurm-dev-client")
    key_type, key_data = paths.host_key.with_suffix(".pub").read_text().split()[:2]
    ports = [settings.ssh_port, *(settings.site_port(site) for site in settings.login_sites)]
    targets = [(settings.ssh_host, port) for port in ports] + list(direct or ())
    entries = "".join(f"[{host}]:{port} {key_type} {key_data}\n" for host, port in targets)
    write_if_changed(paths.known_hosts, entries, 0o644)


def _password_locked(user: str) -> bool:
    """True when the account's shadow password starts with ``!`` (a locked account)."""
    try:
        lines = _SHADOW.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        name, _, rest = line.partition(":")
        if name == user:
            return rest.startswith("!")
    return False


def ensure_user(user: str, home: Path, progress: Callable[[str], None]) -> pwd.struct_passwd:
    """Create account ``user`` (home ``home``) if missing and make it able to log in with a key.

    A fresh ``useradd`` account is locked (``!`` in /etc/shadow), and sshd without PAM
    refuses locked accounts even for key logins; the password is therefore set to ``*``
    (no password can match, but the account is not locked).
    """
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        progress(f"creating user {user}")
        _checked(
            [
                "useradd",
                "--create-home",
                "--home-dir",
                str(home),
                "--shell",
                "/bin/bash",
                "--user-group",
                user,
            ],
            "useradd",
        )
        entry = pwd.getpwnam(user)
    if _password_locked(user):
        _checked(["usermod", "-p", "*", user], "usermod")
    return entry


def ensure_user_files(settings: Settings, entry: pwd.struct_passwd) -> None:
    """authorized_keys with the client key, and the deployment base directory."""
    home = Path(entry.pw_dir)
    ssh_dir = home / ".ssh"
    for directory, mode in (
        (home, 0o755),
        (ssh_dir, 0o700),
        (settings.deployment_base_path, 0o755),
    ):
        directory.mkdir(parents=True, exist_ok=True)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        os.chmod(directory, mode)
    public_key = settings.paths.client_key.with_suffix(".pub").read_text()
    authorized = ssh_dir / "authorized_keys"
    _merge_key(authorized, public_key)
    os.chown(authorized, entry.pw_uid, entry.pw_gid)
    os.chmod(authorized, 0o600)


def _merge_key(authorized: Path, public_key: str) -> bool:
    """Append ``public_key`` to ``authorized`` unless present; True when written."""
    try:
        current = authorized.read_text()
    except OSError:
        current = ""
    key_fields = public_key.split()[:2]
    for line in current.splitlines():
        if line.split()[:2] == key_fields:
            return False
    if current and not current.endswith("\n"):
        current += "\n"
    write_if_changed(authorized, current + public_key.strip() + "\n", 0o600)
    return True


def ensure_privsep_dir() -> None:
    """Create /run/sshd, which sshd requires and which is missing without an init system."""
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


def accepts_option(sshd: str, host_key: Path, line: str) -> bool:
    """True when ``sshd`` accepts the configuration line ``line`` (``sshd -t`` on a probe
    configuration with ``host_key``), False when it rejects that line's keyword (an older
    OpenSSH). Raises :class:`DevClusterError` when the probe fails for another reason."""
    keyword = line.split()[0]
    with tempfile.NamedTemporaryFile("w", prefix="sshd-probe-", suffix=".conf") as probe:
        probe.write(f"HostKey {host_key}\nUsePAM yes\n{line}\n")
        probe.flush()
        proc = subprocess.run(
            [sshd, "-t", "-f", probe.name],
            env=daemon_env(), capture_output=True, text=True, timeout=30, check=False,
        )
    if proc.returncode == 0:
        return True
    if keyword in proc.stderr:
        return False
    raise DevClusterError(f"{sshd} -t on a probe configuration failed: {proc.stderr.strip()}")
