"""Why an SSH login failed, in words: what was tried, what answered, what to check.

paramiko reports a login node that cannot be reached in its own terms: ``[Errno None]
Unable to connect to port 2222`` for a refused TCP connection, ``No existing session`` for a
server that accepted the TCP connection but never sent its banner. The functions here open
the TCP connection themselves and read the state paramiko leaves behind, so that every
failure is a :class:`~dagster_slurm.errors.TransportError` whose message reads::

    SSH login to alice@login.example:2222 (key ~/.ssh/id_ed25519) failed: <what answered>.
    Check <what to check>.

What answered is one of: the host name does not resolve; the TCP connection was refused; no
answer to it within ``connect_timeout``; no route to the host; the TCP connection was
accepted but no SSH banner arrived within ``connect_timeout`` (or it was closed before one
did); the server answered with something other than SSH; the SSH handshake failed; the
server refused the login, with the methods it offers. Failures of the credentials
themselves (refused login, missing, unreadable or passphrase-protected key file, no way to
log in at all) are :class:`~dagster_slurm.errors.AuthenticationFailed`, which is not
retried: repeated failed logins can get an account banned.
"""

from __future__ import annotations

import errno
import os
import socket

import paramiko
from paramiko.common import OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

from dagster_slurm.errors import AuthenticationFailed, CertificateError, TransportError
from dagster_slurm.transport.ssh_target import SSHTarget

#: How to reach a network that the login node is in, for every "cannot reach" message.
REACH_ADVICE = ("that this machine is on the site's network or VPN, or set jump_host to the "
                "site's bastion if the login node is reachable only from there")


def credentials(target: SSHTarget) -> str:
    """How ``target`` logs in, for messages (never the secret): ``key ~/.ssh/id``,
    ``password``, ``ssh-agent keys``."""
    if target.key_path:
        certificate = f" with certificate {target.certificate_path}" \
            if target.certificate_path else ""
        return f"key {target.key_path}{certificate}"
    if target.password:
        return "password"
    return "ssh-agent keys" if target.allow_agent else "no key, password or ssh-agent"


def tried(target: SSHTarget) -> str:
    """``alice@login:22 (key ~/.ssh/id, through jump host bob@bastion:22)``; the host and
    port are the resolved ones, with the ``Host`` name written when an SSH config file
    resolved it: ``alice@10.0.0.5:22 (Host login, key ~/.ssh/id)``."""
    alias = f"Host {target.alias}, " if target.alias else ""
    via = f", through jump host {target.jump.address}" if target.jump else ""
    return f"{target.user}@{target.host}:{target.port} ({alias}{credentials(target)}{via})"


def failure(target: SSHTarget, answered: str, check: str, *,
            kind: type[TransportError] = TransportError) -> TransportError:
    """The error ``SSH login to <tried> failed: <answered>. Check <check>.``"""
    return kind(f"SSH login to {tried(target)} failed: {answered}. Check {check}.")


# -- before connecting: the key file -------------------------------------------------------


def load_key(target: SSHTarget) -> paramiko.PKey | None:
    """The private key of ``target.key_path`` with its certificate when there is one (the
    file ``target.certificate_path`` when set, else ``<key_path>-cert.pub``); None without
    ``key_path``. Raises :class:`AuthenticationFailed` when the key file cannot be used:
    missing, unreadable, protected by a passphrase (the library asks for none), or not a
    private key (a ``.pub`` file); :class:`CertificateError` when the certificate file
    named by ``certificate_path`` is not a certificate of the key."""
    if not target.key_path:
        return None
    path = os.path.expanduser(target.key_path)
    setting = ("key_path, or IdentityFile in the SSH config file (a file on the machine "
               "that runs Dagster; ~ is expanded)")
    try:
        key = paramiko.PKey.from_path(path)
    except FileNotFoundError:
        raise failure(target, f"the key file {path} does not exist", setting,
                      kind=AuthenticationFailed) from None
    except OSError as exc:
        raise failure(target, f"the key file {path} cannot be read ({exc.strerror or exc})",
                      f"the file's permissions and {setting}", kind=AuthenticationFailed) from None
    except (paramiko.PasswordRequiredException, TypeError):
        raise failure(
            target, f"the key file {path} is protected by a passphrase, which the library "
            "does not ask for",
            f"how the key is given: load it into ssh-agent (ssh-add {path}) and leave key_path "
            "unset, or use a key without a passphrase", kind=AuthenticationFailed,
        ) from None
    except (paramiko.SSHException, ValueError) as exc:
        raise failure(
            target, f"the key file {path} is not a private key that can be read "
            f"({str(exc).split('. ')[0]})",
            "that key_path names the private key (id_ed25519, not id_ed25519.pub)",
            kind=AuthenticationFailed,
        ) from None
    if target.certificate_path:
        _load_certificate(target, key, os.path.expanduser(target.certificate_path))
    return key


def _load_certificate(target: SSHTarget, key: paramiko.PKey, path: str) -> None:
    """Offer the certificate ``path`` with ``key`` instead of ``<key_path>-cert.pub``; a
    missing file leaves the key alone, without a certificate."""
    key.public_blob = None  # paramiko attached <key_path>-cert.pub if there is one
    if not os.path.isfile(path):
        return
    try:
        key.load_certificate(path)
    except (OSError, ValueError, paramiko.SSHException) as exc:
        raise failure(target, f"the certificate {path} cannot be used with the key "
                      f"{target.key_path} ({str(exc).split('. ')[0]})",
                      "that CertificateFile in the SSH config file names the certificate of "
                      "the key (IdentityFile)", kind=CertificateError) from None


# -- TCP -----------------------------------------------------------------------------------


def open_tcp(target: SSHTarget, timeout: float) -> tuple[socket.socket, str]:
    """A TCP connection to ``target``'s host and port (each address of the name in turn)
    and the address it reached (``10.0.0.5:22``); raises :class:`TransportError` saying
    what answered when none accepts."""
    try:
        addresses = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise failure(
            target, f"the host name {target.host!r} does not resolve ({exc.strerror})",
            f"the host name; a name known only inside the site's network needs {REACH_ADVICE}",
        ) from None
    last: tuple[str, OSError] | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
            # Without TCP_NODELAY each command's small packets wait for the peer's delayed
            # ACK (about 40 ms a command on Linux); OpenSSH's own ssh sets it too.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, _address_text(address)
        except OSError as exc:
            sock.close()
            last = (_address_text(address), exc)
    assert last is not None, "getaddrinfo returns at least one address or raises"
    raise _tcp_failure(target, *last, timeout)


def _address_text(address: tuple) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tcp_failure(target: SSHTarget, address: str, exc: OSError, timeout: float) -> TransportError:
    host_port = "the host and port (SSHConnectionResource host and port)"
    if isinstance(exc, ConnectionRefusedError):
        return failure(
            target, f"{address} refused the TCP connection (nothing listens on port "
            f"{target.port} there)",
            f"the port (22 unless the site says otherwise) and that sshd runs on {target.host}",
        )
    if isinstance(exc, TimeoutError):
        return failure(
            target, f"no answer to the TCP connection to {address} within {timeout:g} s "
            "(connect_timeout): a firewall drops it, or the host is down or not reachable "
            "from this network", f"{host_port}, and {REACH_ADVICE}",
        )
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return failure(target, f"no route to {address} ({exc.strerror})",
                       f"this machine's network connection, and {REACH_ADVICE}")
    return failure(target, f"the TCP connection to {address} failed ({exc})",
                   f"{host_port}, and {REACH_ADVICE}")


# -- after TCP: banner, handshake, authentication ------------------------------------------


def login_failure(target: SSHTarget, exc: BaseException, client: paramiko.SSHClient,
                  timeout: float, address: str) -> TransportError:
    """The error for ``exc``, raised by ``client.connect`` over a TCP connection to
    ``address`` that was accepted; reads the state of the client's transport (the banner
    received, the handshake done) to tell where the login stopped."""
    transport = client.get_transport()
    banner = transport.remote_version if transport is not None else ""
    if not banner:
        return _no_banner(target, exc, transport, timeout, address)
    if transport is None or not transport.initial_kex_done:
        return failure(
            target, f"the server at {address} ({banner}) answered, but the SSH handshake "
            f"failed: {_text(exc)}",
            "that the server offers a key exchange, cipher and host key type paramiko "
            "supports (an old or hardened sshd), and the server's log",
        )
    return _refused(target, exc, transport, timeout)


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _no_banner(target: SSHTarget, exc: BaseException, transport: paramiko.Transport | None,
               timeout: float, address: str) -> TransportError:
    cause = exc if isinstance(exc, EOFError | ConnectionError) else exc.__context__
    if isinstance(cause, EOFError | ConnectionError):
        return failure(
            target, f"the TCP connection to {address} was accepted, then closed before the "
            "server sent an SSH banner",
            f"that sshd on {target.host} lets this machine in (AllowUsers, DenyUsers, TCP "
            "wrappers, a ban after failed logins such as fail2ban, MaxStartups), and its log",
        )
    return failure(
        target, f"the TCP connection to {address} was accepted, but no SSH banner arrived "
        f"within {timeout:g} s",
        f"that port {target.port} is sshd's and not another service or a proxy, that sshd on "
        f"{target.host} is not hung or overloaded (MaxStartups), or raise connect_timeout on "
        "a slow link",
    )


def _refused(target: SSHTarget, exc: BaseException, transport: paramiko.Transport,
             timeout: float) -> TransportError:
    if isinstance(exc, paramiko.AuthenticationException) and "timeout" in str(exc).lower():
        return failure(target, f"the server did not answer the authentication within {timeout:g} s",
                       f"that sshd on {target.host} is not overloaded, or raise connect_timeout")
    if not isinstance(exc, paramiko.AuthenticationException):
        if "No authentication methods available" in str(exc):
            agent = "set" if os.environ.get("SSH_AUTH_SOCK") else "not set"
            return failure(
                target, "there was nothing to log in with: no key_path, no password, and "
                f"no key from ssh-agent (SSH_AUTH_SOCK is {agent})",
                "the configuration: set key_path or password, or load a key into ssh-agent "
                "(ssh-add)", kind=AuthenticationFailed,
            )
        return failure(target, f"the connection failed during the login: {_text(exc)}",
                       f"the network, and the log of sshd on {target.host}")
    offered = _offered_methods(exc, transport, target.user)
    return failure(
        target, f"the server refused the login of {target.user} with the "
        f"{credentials(target)}; {offered}", _auth_advice(target), kind=AuthenticationFailed,
    )


def _offered_methods(exc: BaseException, transport: paramiko.Transport, user: str) -> str:
    """``it offers: publickey, password``: from ``exc`` when it says, else asked with a
    ``none`` login; or that the server did not say."""
    methods = getattr(exc, "allowed_types", None)
    if not methods and transport.is_active():
        try:
            transport.auth_none(user)
        except paramiko.BadAuthenticationType as probe:
            methods = probe.allowed_types
        except (paramiko.SSHException, OSError, EOFError):
            methods = None
    if not methods:
        return "it did not say which methods it accepts"
    return "it offers: " + ", ".join(methods)


def _auth_advice(target: SSHTarget) -> str:
    if target.key_path:
        return (f"the user name, and that the public half of {target.key_path} is in "
                f"~{target.user}/.ssh/authorized_keys on {target.host}")
    if target.password:
        return ("the user name and the password; a login node that asks for a second factor "
                "(keyboard-interactive) cannot be logged in to with a password alone: use a key")
    return ("the user name, and that ssh-agent holds a key the server accepts (ssh-add -l), "
            "or set key_path")


# -- jump host -----------------------------------------------------------------------------


def jump_failure(target: SSHTarget, exc: TransportError) -> TransportError:
    """``exc`` (the jump host's own failure) said as a failure to reach ``target``, of the
    same class (an authentication failure at the jump host is not retried either)."""
    return type(exc)(f"cannot reach {target.address} through its jump host: {exc}")


def forward_failure(target: SSHTarget, exc: BaseException) -> TransportError:
    """The jump host would not open a TCP connection to ``target`` (``exc``: paramiko's
    :class:`~paramiko.ChannelException` or a connection error)."""
    code = getattr(exc, "code", None)
    if code == OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
        check = "that the jump host allows TCP forwarding (AllowTcpForwarding in its sshd_config)"
    else:
        check = (f"the host and port as the jump host sees them, and that sshd runs on "
                 f"{target.host}")
    return failure(target, f"the jump host could not open a connection to "
                   f"{target.host}:{target.port} ({_text(exc)})", check)
