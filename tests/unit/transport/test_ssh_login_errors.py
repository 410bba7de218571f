"""What an SSH login failure says: what was tried, what answered, what to check.

Real sockets on loopback with short timeouts: a closed port, a listener that accepts the TCP
connection and never sends a banner, one that closes it at once, and a paramiko server that
refuses every login. Failures that no network can show here (a name that does not resolve, a
TCP connection that times out, no route) go through a stand-in for the socket module."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from dagster_slurm.errors import AuthenticationFailed, TransportError
from dagster_slurm.transport import ssh_login
from dagster_slurm.transport.ssh import SSHOptions, SSHTarget, SSHTransport

DEADLINE = 10.0
"""Seconds any helper thread or failure may take before the test fails."""


def _target(port: int, tmp_path: Path, **fields: object) -> SSHTarget:
    values: dict = {"password": "pw", "known_hosts_path": str(tmp_path / "known_hosts"),
                    "host_key_checking": "accept-new", **fields}
    return SSHTarget("127.0.0.1", port, "alice", **values)


def _fail(target: SSHTarget, *, attempts: int = 1, timeout: float = 0.5) -> TransportError:
    sleeps: list[float] = []
    transport = SSHTransport(target, SSHOptions(connect_timeout=timeout,
                                                reconnect_attempts=attempts),
                             sleep=sleeps.append)
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        transport.run(["true"], timeout=5)
    assert time.monotonic() - started < DEADLINE
    transport.close()
    caught.value.sleeps = sleeps  # type: ignore[attr-defined]
    return caught.value


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port whose connections the kernel accepts (backlog) and nobody ever answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()


def test_a_closed_port_says_refused_and_to_check_port_and_sshd(closed_port: int,
                                                              tmp_path: Path) -> None:
    error = _fail(_target(closed_port, tmp_path), attempts=2)
    assert str(error) == (
        f"SSH login to alice@127.0.0.1:{closed_port} (password) failed: 127.0.0.1:{closed_port} "
        f"refused the TCP connection (nothing listens on port {closed_port} there). Check the "
        "port (22 unless the site says otherwise) and that sshd runs on 127.0.0.1. "
        "(2 attempts in 0 s)"
    )
    assert error.sleeps == [1.0]  # type: ignore[attr-defined]
    assert "Errno" not in str(error)


def test_a_listener_without_banner_says_no_ssh_banner_within_the_timeout(
        silent_listener: int, tmp_path: Path) -> None:
    error = _fail(_target(silent_listener, tmp_path), timeout=0.3)
    text = str(error)
    assert text.startswith(
        f"SSH login to alice@127.0.0.1:{silent_listener} (password) failed: the TCP connection "
        f"to 127.0.0.1:{silent_listener} was accepted, but no SSH banner arrived within 0.3 s. "
        f"Check that port {silent_listener} is sshd's and not another service or a proxy, that "
        "sshd on 127.0.0.1 is not hung or overloaded (MaxStartups), or raise connect_timeout"
    ), text
    assert "No existing session" not in text


def test_a_connection_closed_before_the_banner_says_so(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(DEADLINE)
    closed = threading.Event()

    def close_at_once() -> None:
        conn, _ = listener.accept()
        conn.close()
        closed.set()

    thread = threading.Thread(target=close_at_once, daemon=True)
    thread.start()
    try:
        error = _fail(_target(listener.getsockname()[1], tmp_path), timeout=5)
    finally:
        thread.join(DEADLINE)
        listener.close()
    assert closed.is_set()
    assert "was accepted, then closed before the server sent an SSH banner" in str(error)
    assert "fail2ban" in str(error)


class _RefuseEveryLogin(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "publickey,keyboard-interactive"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_FAILED


def test_a_refused_key_names_the_key_and_the_methods_the_server_offers(tmp_path: Path) -> None:
    key_file = tmp_path / "id_ecdsa"
    paramiko.ECDSAKey.generate().write_private_key_file(str(key_file))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(DEADLINE)
    client_done = threading.Event()
    served: list[paramiko.Transport] = []

    def serve() -> None:
        conn, _ = listener.accept()
        server = paramiko.Transport(conn)
        served.append(server)
        server.add_server_key(paramiko.ECDSAKey.generate())
        server.start_server(server=_RefuseEveryLogin())
        client_done.wait(DEADLINE)
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    try:
        error = _fail(_target(port, tmp_path, password=None, key_path=str(key_file),
                              allow_agent=False), attempts=3, timeout=5)
    finally:
        client_done.set()
        thread.join(DEADLINE)
        listener.close()
    assert isinstance(error, AuthenticationFailed)
    assert str(error) == (
        f"SSH login to alice@127.0.0.1:{port} (key {key_file}) failed: the server refused the "
        f"login of alice with the key {key_file}; it offers: publickey, keyboard-interactive. "
        f"Check the user name, and that the public half of {key_file} is in "
        "~alice/.ssh/authorized_keys on 127.0.0.1."
    )
    assert error.sleeps == []  # type: ignore[attr-defined]  # a refused login is not retried
    assert len(served) == 1


@pytest.mark.parametrize(("content", "expected"), [
    (None, "the key file {path} does not exist. Check key_path"),
    ("ssh-ed25519 AAAA me@host\n", "the key file {path} is not a private key that can be read"),
    ("encrypted", "the key file {path} is protected by a passphrase, which the library does "
                  "not ask for. Check how the key is given: load it into ssh-agent"),
])
def test_an_unusable_key_file_is_refused_before_connecting(
        closed_port: int, tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "id_key"
    if content == "encrypted":
        paramiko.ECDSAKey.generate().write_private_key_file(str(path), password="secret")
    elif content is not None:
        path.write_text(content)
    error = _fail(_target(closed_port, tmp_path, password=None, key_path=str(path)), attempts=3)
    assert isinstance(error, AuthenticationFailed)
    assert expected.format(path=path) in str(error)
    assert "refused the TCP connection" not in str(error)  # the key is checked first
    assert error.sleeps == []  # type: ignore[attr-defined]


def test_a_failing_jump_host_is_named_as_the_way_to_the_login_node(closed_port: int,
                                                                   tmp_path: Path) -> None:
    jump = _target(closed_port, tmp_path, password=None, allow_agent=True)
    target = SSHTarget("login.example", 22, "alice", password="pw", jump=jump,
                       host_key_checking="accept-new",
                       known_hosts_path=str(tmp_path / "known_hosts"))
    text = str(_fail(target))
    assert text.startswith(
        "cannot reach alice@login.example:22 through its jump host: SSH login to "
        f"alice@127.0.0.1:{closed_port} (ssh-agent keys) failed: 127.0.0.1:{closed_port} "
        "refused the TCP connection"
    ), text


class _NoNetwork:
    """Stands in for the socket module in ssh_login: resolves every name to one address
    and fails every connect with ``error`` (or fails the lookup)."""

    SOCK_STREAM = socket.SOCK_STREAM
    gaierror = socket.gaierror

    def __init__(self, error: OSError) -> None:
        self.error = error

    def getaddrinfo(self, host: str, port: int, **_: object) -> list:
        if isinstance(self.error, socket.gaierror):
            raise self.error
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.7", port))]

    def socket(self, *_: object) -> _NoNetwork:
        return self

    def settimeout(self, _: float) -> None:
        pass

    def connect(self, _: object) -> None:
        raise self.error

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("error", "answered", "check"), [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "the host name 'login.example' does not resolve (Name or service not known)",
     "Check the host name; a name known only inside the site's network needs that this "
     "machine is on the site's network or VPN, or set jump_host"),
    (TimeoutError("timed out"),
     "no answer to the TCP connection to 192.0.2.7:2222 within 0.5 s (connect_timeout): a "
     "firewall drops it, or the host is down or not reachable from this network",
     "Check the host and port (SSHConnectionResource host and port), and that this machine "
     "is on the site's network or VPN"),
    (OSError(errno.EHOSTUNREACH, "No route to host"),
     "no route to 192.0.2.7:2222 (No route to host)",
     "Check this machine's network connection, and that this machine is on the site's "
     "network or VPN, or set jump_host to the site's bastion"),
])
def test_what_answered_and_what_to_check_when_the_network_does_not(
        monkeypatch: pytest.MonkeyPatch, error: OSError, answered: str, check: str) -> None:
    monkeypatch.setattr(ssh_login, "socket", _NoNetwork(error))
    target = SSHTarget("login.example", 2222, "alice", key_path=None, password="pw")
    with pytest.raises(TransportError) as caught:
        ssh_login.open_tcp(target, 0.5)
    text = str(caught.value)
    assert text.startswith(f"SSH login to alice@login.example:2222 (password) failed: {answered}. ")
    assert check in text
