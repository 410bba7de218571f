"""SSH transport: one paramiko connection per process, shared by every call through channels.

Guarantees:

* At most one login per (process, target): every :meth:`SSHTransport.run` opens a *channel*
  on the shared connection. Sites ban accounts for connection storms, so concurrent callers
  beyond ``max_channels`` wait for a free channel instead of logging in again.
* Host keys are verified against a known_hosts file unless the configuration explicitly
  relaxes it (``host_key_checking="accept-new"`` or ``"off"``); a mismatch is always refused.
* Every call is bounded by a timeout; a dropped connection is re-established a bounded
  number of times *before* a command starts. A connection lost while a command runs raises
  :class:`~dagster_slurm.errors.TransportError`: the command may or may not have run, and
  only the caller knows whether retrying is safe (submissions carry tokens for that).
* Secrets (password, key passphrase) are never logged or included in error messages.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import paramiko

from dagster_slurm.backoff import PollBackoff
from dagster_slurm.errors import (
    AuthenticationFailed,
    CommandTimeout,
    HostKeyError,
    RemoteProgramEnded,
    TransportError,
)
from dagster_slurm.transport import ssh_login
from dagster_slurm.transport.base import CommandResult, LineBuffer, TransportStats, render_command
from dagster_slurm.transport.certificates import prepare_certificate
from dagster_slurm.transport.ssh_auth import NoPromptAuth
from dagster_slurm.transport.ssh_target import HostKeyChecking, SSHOptions, SSHTarget

__all__ = [
    "HostKeyChecking",
    "SSHOptions",
    "SSHStream",
    "SSHTarget",
    "SSHTransport",
    "close_shared_transports",
    "shared_transport",
]

log = logging.getLogger("dagster_slurm.ssh")

_CHUNK = 65536


def _known_hosts_file(target: SSHTarget) -> str:
    return os.path.expanduser(target.known_hosts_path or "~/.ssh/known_hosts")


def _make_client(target: SSHTarget) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    if target.host_key_checking == "off":
        log.warning(
            "host key checking is OFF for %s: the server's identity is not verified", target.label
        )
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        return client
    path = _known_hosts_file(target)
    if os.path.exists(path):
        client.load_host_keys(path)
    elif target.host_key_checking == "strict":
        raise HostKeyError(
            f"known_hosts file {path} does not exist; cannot verify {target.label}. "
            "Create it (e.g. ssh-keyscan) or set known_hosts_path."
        )
    if target.host_key_checking == "accept-new":
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def _connect(target: SSHTarget, options: SSHOptions) -> tuple[paramiko.SSHClient, list]:
    """Log in to ``target`` (through its jump host); returns the client and what to close.

    Every failure is a :class:`TransportError` saying what was tried, what answered and
    what to check (:mod:`dagster_slurm.transport.ssh_login`); nothing opened stays open.
    The key's certificate is checked (and renewed) first, before any connection."""
    prepare_certificate(target)
    key = ssh_login.load_key(target)
    client = _make_client(target)
    to_close: list = []
    try:
        sock, address = _open_socket(target, options, to_close)
        to_close.append(client)
        _login(client, target, options, key, sock, address)
    except BaseException:
        client.close()
        _close_all(to_close)
        raise
    transport = client.get_transport()
    assert transport is not None
    transport.set_keepalive(options.keepalive_interval)
    return client, to_close


def _open_socket(target: SSHTarget, options: SSHOptions,
                 to_close: list) -> tuple[object, str]:
    """A TCP connection to ``target`` (through its jump host when set, whose clients are
    added to ``to_close``) and the address it reached, for messages."""
    if target.jump is None:
        return ssh_login.open_tcp(target, options.connect_timeout)
    try:
        jump_client, jump_close = _connect(target.jump, options)
    except TransportError as exc:
        raise ssh_login.jump_failure(target, exc) from None
    to_close.extend(jump_close)
    jump_transport = jump_client.get_transport()
    assert jump_transport is not None
    try:
        channel = jump_transport.open_channel(
            "direct-tcpip", (target.host, target.port), ("127.0.0.1", 0),
            timeout=options.connect_timeout,
        )
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise ssh_login.forward_failure(target, exc) from None
    return channel, f"{target.host}:{target.port} (through the jump host)"


def _login(client: paramiko.SSHClient, target: SSHTarget, options: SSHOptions,
           key: paramiko.PKey | None, sock: object, address: str) -> None:
    try:
        client.connect(
            target.host,
            port=target.port,
            username=target.user,
            timeout=options.connect_timeout,
            banner_timeout=options.connect_timeout,
            auth_timeout=options.connect_timeout,
            sock=sock,
            # the key is loaded here: paramiko's own loading reports a refused key as a
            # format error; and its own login would prompt on stdin for a second factor
            auth_strategy=NoPromptAuth(target, key),
        )
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(
            f"host key of {target.label} does not match the entry in "
            f"{_known_hosts_file(target)} (got {exc.key.get_name()} "
            f"{exc.key.get_fingerprint().hex()}). Refusing to connect. If the server's key "
            f"changed legitimately, remove the old entry (ssh-keygen -R '[{target.host}]:"
            f"{target.port}')."
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        if "not found in known_hosts" in str(exc):
            raise HostKeyError(
                f"{target.label} is not in {_known_hosts_file(target)}; refusing an unknown "
                "host key. Add it to known_hosts, or set host_key_checking='accept-new'."
            ) from None
        raise ssh_login.login_failure(target, exc, client, options.connect_timeout,
                                      address) from None


def _close_all(items: list) -> None:
    for item in reversed(items):
        try:
            item.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail in many ways
            log.debug("ignoring error while closing an SSH connection", exc_info=True)


class SSHTransport:
    """Runs commands over one shared SSH connection (see the module docstring)."""

    def __init__(
        self,
        target: SSHTarget,
        options: SSHOptions | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.target = target
        self.options = options or SSHOptions()
        self.stats = TransportStats()
        self._sleep = sleep
        self._lock = threading.Lock()
        self._channels = threading.BoundedSemaphore(self.options.max_channels)
        self._client: paramiko.SSHClient | None = None
        self._to_close: list = []

    # -- connection management -------------------------------------------------------------
    def _live_transport(self) -> paramiko.Transport:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                log.warning("SSH connection to %s was lost; reconnecting", self.target.label)
                self._close_locked()
            last: Exception | None = None
            started = time.monotonic()
            backoff = PollBackoff(initial=max(self.options.reconnect_backoff, 1e-3), factor=2.0,
                                  maximum=self.options.reconnect_backoff * 2 ** 16)
            for attempt in range(1, self.options.reconnect_attempts + 1):
                try:
                    self._client, self._to_close = _connect(self.target, self.options)
                    self.stats.connects += 1
                    transport = self._client.get_transport()
                    assert transport is not None
                    return transport
                except (HostKeyError, AuthenticationFailed):
                    raise  # retrying cannot help (and failed logins can get an account banned)
                except TransportError as exc:
                    last = exc
                    if attempt < self.options.reconnect_attempts:
                        delay = backoff.current
                        backoff.observe(False)
                        log.warning(
                            "%s (attempt %d/%d); retrying in %.1f s",
                            exc, attempt, self.options.reconnect_attempts, delay,
                        )
                        self._sleep(delay)
            attempts = self.options.reconnect_attempts
            raise TransportError(
                f"{last} ({attempts} attempt{'s' if attempts > 1 else ''} in "
                f"{time.monotonic() - started:.0f} s)"
            )

    def _close_locked(self) -> None:
        _close_all(self._to_close)
        self._to_close = []
        self._client = None

    def connected(self) -> bool:
        """Whether the SSH connection is up now (False before the first login)."""
        with self._lock:
            transport = self._client.get_transport() if self._client is not None else None
            return transport is not None and transport.is_active()

    def close(self) -> None:
        """Close the connection; a later :meth:`run` reconnects."""
        with self._lock:
            self._close_locked()

    def drop_connection_for_test(self) -> None:
        """Close the underlying socket abruptly, as a network failure would."""
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None:
                    transport.sock.close()

    # -- commands --------------------------------------------------------------------------
    def open_stream(self, argv: Sequence[str]) -> SSHStream:
        """Start ``argv`` as a long-lived stream on its own channel of the shared connection."""
        return SSHStream(self, argv)

    def reserve_channel(self, timeout: float) -> bool:
        """Take one of the ``max_channels`` channel slots, waiting at most ``timeout`` seconds.

        False when no slot became free in time. A slot taken here is given back with
        :meth:`release_channel`.
        """
        return self._channels.acquire(timeout=timeout)

    def release_channel(self) -> None:
        """Give back a slot taken with :meth:`reserve_channel`."""
        self._channels.release()

    def open_channel(self, command: str) -> paramiko.Channel:
        """Start ``command`` on a new channel of the connection, connecting first if needed.

        Tried twice: after a failure the connection is closed and the second try reconnects;
        a second failure raises :class:`~dagster_slurm.errors.TransportError`. The caller
        holds a slot (:meth:`reserve_channel`) and closes the channel.
        """
        for attempt in (1, 2):
            transport = self._live_transport()
            try:
                channel = transport.open_session(timeout=self.options.connect_timeout)
                channel.exec_command(command)
                return channel
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if attempt == 2:
                    raise TransportError(
                        f"could not start a command on {self.target.label}: {exc}"
                    ) from None
                with self._lock:
                    self._close_locked()
        raise AssertionError("unreachable")

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``argv`` on the remote host; see :class:`~dagster_slurm.transport.base.Transport`."""
        command = render_command(argv, env)
        limit = self.options.command_timeout if timeout is None else timeout
        start = time.monotonic()
        deadline = start + limit
        if not self._channels.acquire(timeout=limit):
            raise CommandTimeout(
                f"no free SSH channel to {self.target.label} within {limit:.0f} s "
                f"({self.options.max_channels} in use)"
            )
        try:
            channel = self.open_channel(command)
            try:
                out, err, code = self._exchange(channel, stdin, deadline, command)
            finally:
                channel.close()
        finally:
            self._channels.release()
        self.stats.record(argv[0], len(stdin or b""), len(out) + len(err))
        return CommandResult(
            command,
            code,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            time.monotonic() - start,
        )

    def _exchange(
        self, channel: paramiko.Channel, stdin: bytes | None, deadline: float, command: str
    ) -> tuple[bytes, bytes, int]:
        try:
            if stdin:
                # A memoryview: paramiko's sendall slices its argument after every packet,
                # which copies a bytes object each time (quadratic for large uploads).
                channel.sendall(memoryview(stdin))
            channel.shutdown_write()
            out = bytearray()
            err = bytearray()
            while True:
                while channel.recv_ready():
                    out += channel.recv(_CHUNK)
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(_CHUNK)
                drained = not (channel.recv_ready() or channel.recv_stderr_ready())
                if drained and (channel.eof_received or channel.closed):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(
                        f"{command[:200]!r} on {self.target.label} did not finish in time"
                    )
                select.select([channel], [], [], min(remaining, 1.0))
            if not channel.status_event.wait(max(deadline - time.monotonic(), 0.0)):
                raise CommandTimeout(
                    f"{command[:200]!r} on {self.target.label} did not report an exit status"
                )
            if channel.exit_status == -1 and channel.closed:
                raise TransportError(
                    f"connection to {self.target.label} closed while running "
                    f"{command[:200]!r}; it may or may not have completed"
                )
            return bytes(out), bytes(err), channel.exit_status
        except (TimeoutError, paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(
                f"connection to {self.target.label} failed while running {command[:200]!r}: "
                f"{exc}; it may or may not have completed"
            ) from None


class SSHStream:
    """A long-lived remote command on its own channel (see :class:`~dagster_slurm.transport.base.Stream`).

    It holds one of the transport's ``max_channels`` slots until :meth:`close`.
    """

    def __init__(self, transport: SSHTransport, argv: Sequence[str]) -> None:
        self._owner = transport
        self._argv0 = argv[0]
        if not transport.reserve_channel(transport.options.command_timeout):
            raise CommandTimeout(f"no free SSH channel to {transport.target.label} for a stream")
        self._released = False
        try:
            self._channel = transport.open_channel(render_command(argv))
        except BaseException:
            self._release()
            raise
        self._lines = LineBuffer()
        self._err = bytearray()
        self._pending = 0

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._owner.release_channel()

    def send(self, data: bytes) -> None:
        try:
            self._channel.sendall(memoryview(data))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if self._channel.closed and self._owner.connected():
                # paramiko says "Socket is closed" for a channel whose command has ended
                raise RemoteProgramEnded(
                    f"{self._argv0!r} on {self._owner.target.label} had ended when a request "
                    "was written to it (the SSH connection is up); the request reached nobody"
                ) from None
            raise TransportError(
                f"stream to {self._owner.target.label} failed: {exc}; the request may or may "
                "not have been received"
            ) from None
        self._pending = len(data)

    def readline(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        channel = self._channel
        while True:
            while channel.recv_stderr_ready():
                self._err = (self._err + channel.recv_stderr(_CHUNK))[-8192:]
            line = self._lines.pop_line()
            if line is not None:
                self._owner.stats.record(self._argv0, self._pending, len(line))
                return line
            if channel.recv_ready():
                self._lines.feed(channel.recv(_CHUNK))
                continue
            if channel.eof_received or channel.closed:
                if channel.closed and not channel.eof_received:
                    raise TransportError(
                        f"connection to {self._owner.target.label} was lost during a request; "
                        "it may or may not have completed"
                    )
                return b""
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(
                    f"no answer from {self._argv0!r} on {self._owner.target.label} within "
                    f"{timeout:.0f} s"
                )
            select.select([channel], [], [], min(remaining, 1.0))

    def stderr_tail(self) -> str:
        return self._err.decode("utf-8", "replace")

    def exit_code(self) -> int | None:
        return self._channel.exit_status if self._channel.exit_status_ready() else None

    def close(self) -> None:
        try:
            self._channel.close()
        finally:
            self._release()


_REGISTRY: dict[tuple[int, SSHTarget, SSHOptions], SSHTransport] = {}
_REGISTRY_LOCK = threading.Lock()


def shared_transport(target: SSHTarget, options: SSHOptions | None = None) -> SSHTransport:
    """The process-wide transport for ``target``: one connection per process and target.

    Keyed by the process id too, so a forked child never reuses its parent's socket.
    """
    opts = options or SSHOptions()
    key = (os.getpid(), target, opts)
    with _REGISTRY_LOCK:
        transport = _REGISTRY.get(key)
        if transport is None:
            transport = SSHTransport(target, opts)
            _REGISTRY[key] = transport
        return transport


def close_shared_transports() -> None:
    """Close every shared connection of this process (used at interpreter exit and in tests)."""
    with _REGISTRY_LOCK:
        items = [t for (pid, _, _), t in _REGISTRY.items() if pid == os.getpid()]
    for transport in items:
        transport.close()
