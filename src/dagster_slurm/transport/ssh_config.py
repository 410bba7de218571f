"""What an OpenSSH client configuration file (``~/.ssh/config``) says about one host.

The connection does not run ``ssh``, but it reads the keys of the file that decide where
and as whom it logs in, resolved for a host as ``ssh`` resolves them (``Host`` and
``Match`` blocks in file order, the first value found for a key wins, ``Host *`` defaults
at the end apply to every host):

``HostName``, ``User``, ``Port``
    where to connect and the user to log in as;
``IdentityFile``
    the first one, with ``~`` and the ``%``-tokens paramiko expands;
``CertificateFile``, ``UserKnownHostsFile``
    the first one, with ``~`` and the tokens ``%d %h %i %n %p %r %u %%`` expanded;
``ProxyJump``
    ``a,b`` connects to ``a``, from there to ``b``, and from ``b`` to the host; each hop may
    be ``[user@]host[:port]`` (or ``ssh://[user@]host[:port]``) and is looked up in the file
    itself; ``none`` means no jump host;
``ServerAliveInterval``
    seconds between keepalive messages.

Every other key is ignored (the resource's own fields cover authentication and host key
checking). ``Include`` lines are not followed: paramiko, which parses the file, does not
support them; a warning says so once per version of the file.

The file is parsed once per path and modification time (:func:`read_config`). A file that
does not exist gives no settings; one that cannot be read or parsed, or that gives a value
that cannot be used (``Port ssh``), is a :class:`~dagster_slurm.errors.ConfigurationError`
naming the file. :func:`jump_chain` turns a ``ProxyJump`` list into the chain of
:class:`~dagster_slurm.transport.ssh_target.SSHTarget` that the transport connects through.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.transport.ssh_target import SSHTarget

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_PORT",
    "MAX_JUMPS",
    "HostConfig",
    "JumpHop",
    "host_config",
    "jump_chain",
    "local_user",
    "parse_jump",
    "read_config",
]

log = logging.getLogger("dagster_slurm.ssh")

DEFAULT_CONFIG_PATH = "~/.ssh/config"
"""The file ``ssh`` reads for the user running it."""

DEFAULT_PORT = 22
"""The port when neither the resource nor the file gives one."""

MAX_JUMPS = 8
"""Most jump hosts one connection goes through, counting those the hops' own ``ProxyJump``
adds; a longer chain is taken for a loop in the file."""

FIELD = "ssh_config_path"
"""The resource field named by errors of this module."""

_INCLUDE = re.compile(r"^\s*include(\s|=)", re.IGNORECASE)
_TOKEN = re.compile(r"%(.)")


def local_user() -> str:
    """The name ``ssh`` logs in with when nothing gives one: this process's user."""
    try:
        import pwd
    except ImportError:  # not on POSIX
        return getpass.getuser()
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a user id without a passwd entry (some containers)
        return getpass.getuser()


# -- the file ------------------------------------------------------------------------------

_CACHE: dict[str, tuple[tuple[int, int], paramiko.SSHConfig]] = {}
_CACHE_LOCK = threading.Lock()


def _unreadable(path: str, file: str, problem: str) -> ConfigurationError:
    return ConfigurationError(FIELD, path, f"the OpenSSH client configuration {file} {problem}")


def read_config(path: str) -> paramiko.SSHConfig | None:
    """The parsed file ``path`` (``~`` expanded); None when it does not exist. Parsed again
    only when its modification time or size changed since the last call."""
    file = os.path.expanduser(path)
    try:
        status = os.stat(file)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unreadable(path, file, f"cannot be read ({exc.strerror or exc})") from None
    version = (status.st_mtime_ns, status.st_size)
    with _CACHE_LOCK:
        cached = _CACHE.get(file)
    if cached is not None and cached[0] == version:
        return cached[1]
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise _unreadable(path, file, f"is not a text file ({exc.reason})") from None
    except OSError as exc:
        raise _unreadable(path, file, f"cannot be read ({exc.strerror or exc})") from None
    try:
        parsed = paramiko.SSHConfig.from_text(text)
    except (paramiko.ConfigParseError, ValueError) as exc:
        raise _unreadable(path, file, f"cannot be parsed ({exc})") from None
    if any(_INCLUDE.match(line) for line in text.splitlines()):
        log.warning("%s has Include lines; the files they name are not read (only %s itself "
                    "is)", file, file)
    with _CACHE_LOCK:
        _CACHE[file] = (version, parsed)
    return parsed


# -- one host ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JumpHop:
    """One entry of a ``ProxyJump`` list: ``[user@]host[:port]``; None: not given."""

    host: str
    user: str | None = None
    port: int | None = None


@dataclass(frozen=True)
class HostConfig:
    """What the file says for the host ``name`` (as looked up); None: it says nothing.

    ``proxy_jump`` is the ``ProxyJump`` list, first hop first; ``()`` for ``ProxyJump
    none``. ``hostname`` is None when it is ``name`` itself."""

    name: str
    hostname: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    certificate_file: str | None = None
    proxy_jump: tuple[JumpHop, ...] | None = None
    known_hosts_file: str | None = None
    server_alive_interval: int | None = None


def _number(path: str, host: str, key: str, text: str, *, least: int, most: int) -> int:
    value = text.strip()
    if not value.isdigit() or not least <= int(value) <= most:
        raise ConfigurationError(
            FIELD, path, f"{key} {text!r} of host {host!r} in {os.path.expanduser(path)} is "
            f"not a whole number from {least} to {most}")
    return int(value)


def parse_jump(path: str, host: str, text: str) -> tuple[JumpHop, ...]:
    """The hops of the ``ProxyJump`` value ``text`` of ``host`` in the file ``path``;
    ``()`` for ``none``."""
    if text.strip().lower() == "none":
        return ()
    hops = []
    for entry in text.split(","):
        spec = entry.strip()
        spec = spec[len("ssh://"):] if spec.startswith("ssh://") else spec
        user, _, address = spec.rpartition("@")
        name, port = address, None
        if address.startswith("["):
            name, _, rest = address[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else None
        elif address.count(":") == 1:
            name, port = address.split(":")
        if not name:
            raise ConfigurationError(FIELD, path, f"ProxyJump {text!r} of host {host!r} in "
                                     f"{os.path.expanduser(path)} has an entry without a host")
        hops.append(JumpHop(
            name, user or None,
            _number(path, host, "the ProxyJump port", port, least=1, most=65535)
            if port is not None else None))
    return tuple(hops)


def _expand(value: str, *, host: str, name: str, port: int, user: str) -> str:
    """``value`` with a leading ``~`` and the ``%``-tokens of a file name expanded."""
    tokens = {"%": "%", "d": os.path.expanduser("~"), "h": host, "n": name, "p": str(port),
              "r": user, "u": local_user()}
    if hasattr(os, "getuid"):  # POSIX
        tokens["i"] = str(os.getuid())
    expanded = _TOKEN.sub(lambda match: tokens.get(match.group(1), match.group(0)), value)
    return os.path.expanduser(expanded)


def host_config(path: str | None, name: str) -> HostConfig:
    """What the file ``path`` says for the host ``name``; no settings for ``path`` None or a
    file that does not exist. Raises :class:`ConfigurationError` (naming the file) when it
    cannot be read, or gives a value that cannot be used."""
    parsed = read_config(path) if path is not None else None
    if parsed is None:
        return HostConfig(name)
    assert path is not None
    try:
        found = parsed.lookup(name)
    except (paramiko.SSHException, ImportError, OSError, ValueError) as exc:
        raise _unreadable(path, os.path.expanduser(path),
                          f"cannot be applied to host {name!r} ({type(exc).__name__}: {exc})"
                          ) from None
    hostname = found.get("hostname") or name
    port = (_number(path, name, "Port", found["port"], least=1, most=65535)
            if "port" in found else None)
    user = found.get("user")

    def first_file(key: str) -> str | None:
        raw = found.get(key)
        words = (raw if isinstance(raw, list) else [raw]) if raw else []
        if not words or not words[0].split():
            return None
        return _expand(words[0].split()[0], host=hostname, name=name,
                       port=port or DEFAULT_PORT, user=user or local_user())

    identities = found.get("identityfile") or []
    jump = found.get("proxyjump")
    alive = found.get("serveraliveinterval")
    return HostConfig(
        name=name,
        hostname=hostname if hostname != name else None,
        user=user,
        port=port,
        identity_file=os.path.expanduser(identities[0]) if identities else None,
        certificate_file=first_file("certificatefile"),
        proxy_jump=parse_jump(path, name, jump) if jump is not None else None,
        known_hosts_file=first_file("userknownhostsfile"),
        server_alive_interval=(_number(path, name, "ServerAliveInterval", alive, least=0,
                                       most=2**31 - 1) if alive is not None else None),
    )


# -- ProxyJump chains ----------------------------------------------------------------------


def jump_chain(path: str | None, hops: Sequence[JumpHop], target: SSHTarget) -> SSHTarget | None:
    """The jump host through which ``target`` is reached for the ``ProxyJump`` list ``hops``
    (first hop first) of the file ``path``; None for no hops.

    The result is the last hop; its ``jump`` is the hop before, and so on. The first hop is
    reached through its own ``ProxyJump`` in the file, as ``ssh`` does; the later hops'
    own ``ProxyJump`` is not used (the list says how they are reached). Each hop takes
    ``HostName``, ``User``, ``Port``, ``IdentityFile``, ``CertificateFile`` and
    ``UserKnownHostsFile`` from the file; a user or port in the list wins, a hop without a
    user logs in as :func:`local_user`. A hop without an ``IdentityFile`` logs in with
    ``target``'s key (and its certificate and renewal command) and the ssh-agent; every hop
    has ``target``'s host key checking and ssh-agent setting, and no password. Raises
    :class:`ConfigurationError` when the chain loops back on itself or is longer than
    :data:`MAX_JUMPS`."""
    return _chain(path, tuple(hops), target, (target.alias or target.host,))


def _chain(path: str | None, hops: tuple[JumpHop, ...], target: SSHTarget,
           seen: tuple[str, ...]) -> SSHTarget | None:
    if not hops:
        return None
    file = os.path.expanduser(path or "")
    if len(seen) + len(hops) > MAX_JUMPS + 1:
        raise ConfigurationError(FIELD, path, f"the ProxyJump chain to {seen[0]!r} in {file} "
                                 f"has more than {MAX_JUMPS} jump hosts; does it loop?")
    *before, last = hops
    found = host_config(path, last.host)
    if before:
        jump = _chain(path, tuple(before), target, (*seen, last.host))
    else:
        if last.host in seen:
            raise ConfigurationError(
                FIELD, path, f"the ProxyJump chain {' -> '.join((*seen, last.host))} in {file} "
                f"loops back to {last.host!r}; a ProxyJump of 'Host *' applies to the jump "
                f"host too: give {last.host!r} 'ProxyJump none' in a Host block before it")
        jump = _chain(path, found.proxy_jump or (), target, (*seen, last.host))
    return _hop(last, found, target, jump)


def _hop(hop: JumpHop, found: HostConfig, target: SSHTarget,
         jump: SSHTarget | None) -> SSHTarget:
    own_key = found.identity_file
    key_path = own_key or target.key_path
    certificate = found.certificate_file if own_key else (found.certificate_file
                                                          or target.certificate_path)
    same_key = key_path == target.key_path and certificate == target.certificate_path
    host = found.hostname or hop.host
    return SSHTarget(
        host=host,
        port=hop.port if hop.port is not None else found.port or DEFAULT_PORT,
        user=hop.user or found.user or local_user(),
        key_path=key_path,
        known_hosts_path=found.known_hosts_file or target.known_hosts_path,
        host_key_checking=target.host_key_checking,
        allow_agent=target.allow_agent,
        jump=jump,
        certificate_renew_command=target.certificate_renew_command if same_key else None,
        certificate_min_validity=target.certificate_min_validity,
        certificate_path=certificate if key_path else None,
        alias=hop.host if host != hop.host else None,
    )
