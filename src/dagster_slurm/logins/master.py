"""Start, describe and end the OpenSSH master connection of a shared login.

The master is the user's own ``ssh`` with ``ControlMaster=yes`` and a control socket at
the login's :class:`~dagster_slurm.transport.login_place.LoginPlace`. ``ssh`` itself
prompts on the terminal for whatever the site asks (showing the site's own prompt text),
reads the user's ``~/.ssh/config`` (aliases, ProxyJump, certificates, Kerberos, FIDO
keys), then goes to the background (``-f``) and stays up while it is used, closing after
``ControlPersist`` seconds without a command. Its own messages go to ``<name>.log`` next to
the socket.
"""

from __future__ import annotations

import getpass
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from dagster_slurm.errors import AuthenticationFailed, ConfigurationError
from dagster_slurm.transport.certificates import prepare_certificate
from dagster_slurm.transport.login_place import LoginPlace, LoginRecord, ensure_private_dir
from dagster_slurm.transport.openssh import control_argv, master_pid
from dagster_slurm.transport.ssh_target import SSHTarget

DEFAULT_IDLE_LIFETIME = 12 * 3600.0
"""Seconds a shared login stays up without a command (a working day)."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_CHECKING = {"strict": "yes", "accept-new": "accept-new", "off": "no"}


def parse_duration(text: str, name: str = "--persist") -> float:
    """Seconds of ``12h``, ``90m``, ``30s``, ``1d`` or a plain number of seconds; raises
    :class:`ConfigurationError` naming ``name`` otherwise."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:], None)
    number = value[:-1] if unit else value
    try:
        seconds = float(number) * (unit or 1)
    except ValueError:
        raise ConfigurationError(name, text, "must be a duration such as 12h, 90m or 3600") from None
    if seconds <= 0:
        raise ConfigurationError(name, text, "must be longer than zero")
    return seconds


def _hop(target: SSHTarget, ssh: str) -> list[str]:
    """``ssh`` options and destination reaching ``target`` (through its own jump hosts)."""
    argv = ["-p", str(target.port), "-l", target.user]
    if target.key_path:
        argv = ["-i", target.key_path, "-o", "IdentitiesOnly=yes", *argv]
    if target.known_hosts_path:
        argv = ["-o", f"UserKnownHostsFile={target.known_hosts_path}", *argv]
    argv = ["-o", f"StrictHostKeyChecking={_CHECKING[target.host_key_checking]}", *argv]
    if target.jump is not None:
        inner = [ssh, *_hop(target.jump, ssh), "-W", f"{target.host}:{target.port}",
                 target.jump.host]
        # ssh expands %-tokens in ProxyCommand: a literal % is written %%
        argv = ["-o", "ProxyCommand=" + shlex.join(inner).replace("%", "%%"), *argv]
    return argv


def master_argv(target: SSHTarget, place: LoginPlace, idle_lifetime: float,
                ssh: str = "ssh") -> list[str]:
    """The ``ssh`` command that starts ``target``'s shared login master at ``place``.

    Passwords are never on it: ssh asks for them on the terminal. A target resolved from a
    ``Host`` alias of ``~/.ssh/config`` is reached by that alias, so that everything its
    block says applies (GSSAPI, certificates, ...); the resolved user, port and jump hosts
    are given explicitly as well, and agree with it."""
    return [
        ssh, "-o", "ControlMaster=yes", "-S", str(place.socket),
        "-o", f"ControlPersist={max(int(idle_lifetime), 1)}s",
        "-o", "ServerAliveInterval=30", "-E", str(log_path(place)), "-N", "-f",
        *_config_file(target), *_hop(target, ssh), target.alias or target.host,
    ]


def _config_file(target: SSHTarget) -> list[str]:
    """``-F file`` when the target's alias comes from a file other than ``~/.ssh/config``."""
    if target.config_file and target.config_file != os.path.expanduser("~/.ssh/config"):
        return ["-F", target.config_file]
    return []


def log_path(place: LoginPlace) -> Path:
    """Where the master writes its own messages."""
    return place.directory / f"{place.name}.log"


@dataclass(frozen=True)
class LoginStatus:
    """A shared login as seen now: ``pid`` of the master (None: not up) and its record
    (None when none was written, e.g. a master started by hand)."""

    place: LoginPlace
    pid: int | None
    record: LoginRecord | None

    @property
    def up(self) -> bool:
        """Whether the master answers."""
        return self.pid is not None

    def render(self, now: float | None = None) -> str:
        """Lines for ``dagster-slurm login --status``."""
        moment = time.time() if now is None else now
        head = f"shared login to {self.place.label}: "
        if not self.up:
            return head + "not up (run dagster-slurm login)"
        lines = [head + f"up (ssh master pid {self.pid})"]
        if self.record is not None:
            record = self.record
            lines.append(f"  logged in by {record.local_user} on this machine at "
                         f"{_utc(record.started)} ({_span(moment - record.started)} ago)")
            lines.append(f"  stays up while it is used; ends {_span(record.idle_lifetime)} "
                         "after the last command (ControlPersist), or at dagster-slurm logout")
        lines.append(f"  control socket: {self.place.socket}")
        return "\n".join(lines)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def status(place: LoginPlace, ssh: str = "ssh") -> LoginStatus:
    """The shared login at ``place`` now."""
    return LoginStatus(place, master_pid(place, ssh), LoginRecord.read(place.record_path))


def start(target: SSHTarget, place: LoginPlace, idle_lifetime: float = DEFAULT_IDLE_LIFETIME,
          ssh: str = "ssh") -> LoginStatus:
    """Start the master unless it is up, letting ``ssh`` prompt on this terminal; returns
    the status. The certificate next to the key is checked (and renewed when the target
    says how) first: an expired one raises
    :class:`~dagster_slurm.errors.CertificateError` naming its expiry before ssh runs.
    Raises :class:`AuthenticationFailed` with the end of ssh's log when the login fails."""
    ensure_private_dir(place.directory)
    place.check_socket_path()
    current = status(place, ssh)
    if current.up:
        return current
    prepare_certificate(target)  # an expired certificate is named before ssh tries it
    place.socket.unlink(missing_ok=True)  # a stale socket of a master that died
    log = log_path(place)
    log.unlink(missing_ok=True)
    argv = master_argv(target, place, idle_lifetime, ssh)
    code = subprocess.call(argv)
    now = status(place, ssh)
    if code != 0 or not now.up:
        tail = log.read_text(errors="replace").strip()[-1500:] if log.exists() else ""
        raise AuthenticationFailed(
            f"ssh could not log in to {target.label} (exit status {code}): "
            f"{tail or 'no message'}. Command: {shlex.join(argv)}"
        )
    record = LoginRecord(target=target.label, local_user=getpass.getuser(), started=time.time(),
                         idle_lifetime=idle_lifetime, command=tuple(argv))
    record.write(place.record_path)
    return LoginStatus(place, now.pid, record)


def stop(place: LoginPlace, ssh: str = "ssh") -> bool:
    """End the master at ``place``; True when one was up."""
    was_up = master_pid(place, ssh) is not None
    if was_up:
        subprocess.run(control_argv(place, "exit", ssh), capture_output=True, timeout=30,
                       check=False, stdin=subprocess.DEVNULL)
    place.record_path.unlink(missing_ok=True)
    return was_up
