"""Where a shared login lives on this machine, and what is recorded about it.

A shared login (``dagster-slurm login``) is an OpenSSH master connection whose control
socket every process of the same OS user finds at a fixed path derived from the login's
host, port and user (:class:`LoginPlace`). The directory is private to the user (0700,
owned by the user; anything else is refused), because whoever can open the socket runs
commands as the cluster user without logging in.

Next to the socket, ``<name>.json`` (0600) records who logged in, to where, when, and the
idle lifetime the master was started with, for ``dagster-slurm login --status``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.transport.ssh_target import SSHTarget

LOGIN_DIR_ENV = "DAGSTER_SLURM_LOGIN_DIR"
"""Environment variable naming the directory of the shared logins' sockets and records."""

SOCKET_PATH_LIMIT = 104
"""Longest Unix socket path accepted everywhere (Linux allows 107 bytes, macOS 103)."""


def login_dir(environ: dict[str, str] | None = None) -> Path:
    """The directory of shared logins: ``$DAGSTER_SLURM_LOGIN_DIR`` when set, else
    ``$XDG_RUNTIME_DIR/dagster-slurm-logins`` when that directory exists (a per-user tmpfs
    on most Linux desktops), else ``~/.dagster-slurm/logins``."""
    env = os.environ if environ is None else environ
    if env.get(LOGIN_DIR_ENV):
        return Path(env[LOGIN_DIR_ENV]).expanduser()
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "dagster-slurm-logins"
    return Path("~/.dagster-slurm/logins").expanduser()


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (0700) unless it exists; refuse one that others could use.

    Raises :class:`~dagster_slurm.errors.ConfigurationError` naming the directory when it
    is owned by another user or open to the group or others, because a control socket in
    it would let them run commands as the cluster user."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(LOGIN_DIR_ENV, str(path), "is not a directory")
    if info.st_uid != os.getuid():
        raise ConfigurationError(
            LOGIN_DIR_ENV, str(path),
            f"is owned by uid {info.st_uid}, not by this user (uid {os.getuid()}); choose a "
            "directory of your own",
        )
    if info.st_mode & 0o077:
        raise ConfigurationError(
            LOGIN_DIR_ENV, str(path),
            f"is open to others (mode {stat.S_IMODE(info.st_mode):o}); run chmod 700 on it",
        )
    return path


@dataclass(frozen=True)
class LoginPlace:
    """The control socket and record of the shared login to ``user@host:port``."""

    host: str
    port: int
    user: str
    directory: Path

    @classmethod
    def of(cls, target: SSHTarget, directory: Path | None = None) -> LoginPlace:
        """The place of ``target``'s shared login (in :func:`login_dir` unless given)."""
        return cls(target.host, target.port, target.user, directory or login_dir())

    @property
    def name(self) -> str:
        """A short name derived from user, host and port (socket paths are limited)."""
        digest = hashlib.sha256(f"{self.user}@{self.host}:{self.port}".encode()).hexdigest()
        return digest[:16]

    @property
    def socket(self) -> Path:
        """The master's control socket."""
        return self.directory / f"{self.name}.sock"

    @property
    def record_path(self) -> Path:
        """The JSON record written by ``dagster-slurm login``."""
        return self.directory / f"{self.name}.json"

    @property
    def label(self) -> str:
        """``user@host:port``."""
        return f"{self.user}@{self.host}:{self.port}"

    def check_socket_path(self) -> None:
        """Raise :class:`ConfigurationError` when the socket path is too long for a Unix socket."""
        if len(os.fsencode(str(self.socket))) > SOCKET_PATH_LIMIT:
            raise ConfigurationError(
                LOGIN_DIR_ENV, str(self.directory),
                f"gives a control socket path longer than {SOCKET_PATH_LIMIT} bytes; choose "
                "a shorter directory",
            )


def login_command(target: SSHTarget) -> str:
    """The command a person runs on this machine to establish ``target``'s shared login."""
    argv = ["dagster-slurm", "login", "--host", target.host, "--port", str(target.port),
            "--user", target.user]
    if target.key_path:
        argv += ["--key", target.key_path]
    if target.jump is not None:
        argv += ["--jump", f"{target.jump.user}@{target.jump.host}:{target.jump.port}"]
    return shlex.join(argv)


@dataclass(frozen=True)
class LoginRecord:
    """What ``dagster-slurm login`` recorded: the target, the OS user who logged in, when
    (seconds since the epoch), the idle lifetime in seconds (``ControlPersist``), and the
    ssh command that started the master (no secrets: ssh prompts for those itself)."""

    target: str
    local_user: str
    started: float
    idle_lifetime: float
    command: tuple[str, ...]

    def write(self, path: Path) -> None:
        """Write atomically with mode 0600 (never a half-written record)."""
        data = json.dumps({**asdict(self), "command": list(self.command)}, indent=1)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".login-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(data + "\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def read(cls, path: Path) -> LoginRecord | None:
        """The record at ``path``; None when it is missing or unreadable."""
        try:
            data = json.loads(path.read_text())
            return cls(
                target=str(data["target"]), local_user=str(data["local_user"]),
                started=float(data["started"]), idle_lifetime=float(data["idle_lifetime"]),
                command=tuple(str(part) for part in data["command"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
