"""Commands through a shared login: OpenSSH's own ``ssh`` as a client of a master connection.

A person establishes the master once per machine (``dagster-slurm login``, see
:mod:`dagster_slurm.logins`); every process of the same OS user then runs its commands as
multiplexed sessions of that one connection, by starting ``ssh`` with the master's control
socket (:class:`OpenSSHTransport`). No process logs in by itself, so a site that asks for
a one-time code sees one authentication per machine, not one per process.

Guarantees:

* A client never logs in on its own and never prompts: ``ControlMaster=no`` with
  ``BatchMode=yes``, a new session without a terminal, and ``ProxyCommand=false``, so when
  the master is gone the fallback to a direct connection fails at once instead of asking
  for a code. The user's ``~/.ssh/config`` is not read by the clients (``-F /dev/null``):
  the master already holds everything it configured.
* A command that cannot run because the master is gone, or that was cut off because it
  ended, raises :class:`~dagster_slurm.errors.LoginRequired` naming the ``dagster-slurm
  login`` command; a command cut off may or may not have completed. The next command after
  a new login works (the socket's path does not change).
* Exit status 255 is ssh's own failure status; it is reported as the command's status only
  while the master is still up and ssh said nothing about the control socket.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dagster_slurm.backoff import PollBackoff
from dagster_slurm.errors import CommandTimeout, LoginRequired, RemoteProgramEnded, TransportError
from dagster_slurm.transport import mux_client
from dagster_slurm.transport.base import CommandResult, LineBuffer, TransportStats, render_command
from dagster_slurm.transport.login_place import LoginPlace, login_command
from dagster_slurm.transport.ssh_target import SSHOptions, SSHTarget

SSH_FAILURE = 255
"""ssh's exit status for its own failures (also a possible status of a remote command)."""

CHECK_TIMEOUT = 10.0
"""Seconds ``ssh -O check`` may take (a local request to the master)."""

log = logging.getLogger("dagster_slurm.ssh")

_MUX_TROUBLE = ("control socket", "mux_client", "controlsocket", "kex_exchange_identification",
                "connection closed by unknown", "master refused", "session open refused")

_SESSION_REFUSED = ("session open refused", "administratively prohibited")
"""What ssh says when the server refused a new session on the master's connection (its
``MaxSessions`` is reached): nothing ran, so the command is started again later."""

STREAM_OPEN = "dagster-slurm-session-open"
"""The line a stream's session prints before its command starts: the session is open."""

SESSION_RETRY_DELAY = 0.2
"""Seconds between tries while the server refuses new sessions (doubling up to 5 s)."""


class _RefusedSessions:
    """The wait between tries of a session the server refused (``MaxSessions``): back-off
    from :data:`SESSION_RETRY_DELAY` doubling up to 5 s, until ``limit`` seconds from now."""

    def __init__(self, label: str, what: str, limit: float) -> None:
        self.label, self.what, self.limit = label, what, limit
        self.deadline = time.monotonic() + limit
        self.backoff = PollBackoff(initial=SESSION_RETRY_DELAY, maximum=5.0, factor=2.0)
        self.delay = SESSION_RETRY_DELAY

    def wait(self) -> None:
        """Sleep before the next try; :class:`CommandTimeout` when it would pass the limit."""
        if time.monotonic() + self.delay >= self.deadline:
            raise CommandTimeout(
                f"the login node refused a new session for {self.what} on the shared login "
                f"to {self.label} for {self.limit:.0f} s: its sshd allows that many sessions "
                "per connection (MaxSessions) and all are in use by this machine's processes")
        log.info("the login node refuses more sessions on the shared login to %s "
                 "(MaxSessions reached); trying again in %.1f s", self.label, self.delay)
        time.sleep(self.delay)
        self.delay = self.backoff.observe(False)


def client_argv(place: LoginPlace, ssh: str = "ssh") -> list[str]:
    """``ssh`` arguments, up to the destination, for a session of ``place``'s master."""
    return [
        ssh, "-F", "/dev/null", "-S", str(place.socket),
        "-o", "ControlMaster=no", "-o", "BatchMode=yes", "-o", "ProxyCommand=false",
        "-o", "LogLevel=ERROR", "-T", "-x", "-a",
        "-p", str(place.port), "-l", place.user, place.host,
    ]


def control_argv(place: LoginPlace, operation: str, ssh: str = "ssh") -> list[str]:
    """``ssh -O <operation>`` (``check`` or ``exit``) for ``place``'s master."""
    return [ssh, "-F", "/dev/null", "-S", str(place.socket), "-O", operation,
            "-p", str(place.port), "-l", place.user, place.host]


def master_pid(place: LoginPlace, ssh: str = "ssh", *, native: bool = True) -> int | None:
    """The pid of ``place``'s master when it answers an alive check; None when it is not up
    (no socket, a stale socket, or no answer within :data:`CHECK_TIMEOUT`). Asked through
    the master's protocol, or with ``ssh -O check`` from a master speaking another version."""
    if not place.socket.exists():
        return None
    if native:
        try:
            return mux_client.alive_pid(str(place.socket), CHECK_TIMEOUT)
        except mux_client.MuxUnsupported:
            pass
    try:
        proc = subprocess.run(control_argv(place, "check", ssh), capture_output=True, text=True,
                              timeout=CHECK_TIMEOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    text = proc.stderr + proc.stdout
    start = text.find("pid=")
    digits = "".join(ch for ch in text[start + 4:start + 16] if ch.isdigit()) if start >= 0 else ""
    return int(digits) if digits else 0


@dataclass(frozen=True)
class _Outcome:
    """One try of a command: its status and output; ``native``: run through the master's
    protocol (a 255 is then the command's own status); ``refused``: the session was refused
    and nothing ran."""

    code: int
    out: bytes
    err: bytes
    native: bool
    refused: bool = False


class OpenSSHTransport:
    """Runs commands as sessions of the shared login to ``target`` (see the module docstring)."""

    def __init__(self, target: SSHTarget, options: SSHOptions | None = None, *,
                 place: LoginPlace | None = None, ssh: str = "ssh",
                 stats: TransportStats | None = None, native: bool = True) -> None:
        self.target = target
        self.options = options or SSHOptions()
        self.place = place or LoginPlace.of(target)
        self.stats = stats or TransportStats()
        self._ssh = ssh
        self._channels = threading.BoundedSemaphore(self.options.max_channels)
        self._native = native

    def login_required(self, what: str) -> LoginRequired:
        """The error for a command that could not use the shared login."""
        return LoginRequired(
            f"{what}: the shared login to {self.target.label} is not up (control socket "
            f"{self.place.socket}). Log in once on this machine with: "
            f"{login_command(self.target)}"
        )

    def alive(self) -> bool:
        """Whether the master answers now."""
        return master_pid(self.place, self._ssh, native=self._native) is not None

    def connected(self) -> bool:
        """Same as :meth:`alive` (this process holds no connection of its own)."""
        return self.alive()

    def close(self) -> None:
        """Nothing to release: the master belongs to the login, not to this process."""

    def _argv(self, command: str) -> list[str]:
        return [*client_argv(self.place, self._ssh), "--", command]

    def spawn(self, command: str) -> subprocess.Popen[bytes]:
        """Start ``command`` as a session of the master through an ``ssh`` client process."""
        if not self.place.socket.exists():
            raise self.login_required(f"cannot run {command[:200]!r}")
        try:
            return subprocess.Popen(
                self._argv(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(f"cannot start ssh ({self._ssh}) for {self.target.label}: "
                                 f"{exc}") from None

    def failure(self, command: str, stderr: str) -> TransportError:
        """The error for ssh's own failure (status 255) of ``command``."""
        if not self.alive():
            return self.login_required(
                f"{command[:200]!r} on {self.target.label} may or may not have completed")
        return TransportError(
            f"ssh could not run {command[:200]!r} through the shared login to "
            f"{self.target.label}: {stderr.strip()[-500:]}"
        )

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run ``argv`` on the login node; see :class:`~dagster_slurm.transport.base.Transport`."""
        command = render_command(argv, env)
        limit = self.options.command_timeout if timeout is None else timeout
        start = time.monotonic()
        if not self._channels.acquire(timeout=limit):
            raise CommandTimeout(f"no free session to {self.target.label} within {limit:.0f} s "
                                 f"({self.options.max_channels} in use)")
        try:
            outcome = self._run_once(command, stdin, start + limit)
            refusals = _RefusedSessions(self.target.label, repr(command[:200]), limit)
            while outcome.refused:
                refusals.wait()
                outcome = self._run_once(command, stdin, start + limit)
        finally:
            self._channels.release()
        code, out, err = outcome.code, outcome.out, outcome.err
        err_text = err.decode("utf-8", "replace")
        if (not outcome.native and code == SSH_FAILURE
                and (_mux_trouble(err_text) or not self.alive())):
            raise self.failure(command, err_text)
        self.stats.record(argv[0], len(stdin or b""), len(out) + len(err))
        return CommandResult(command, code, out.decode("utf-8", "replace"), err_text,
                             time.monotonic() - start)

    def _run_once(self, command: str, stdin: bytes | None, deadline: float) -> _Outcome:
        """One try: through the master's protocol directly, else (a master speaking another
        protocol version) through an ``ssh`` client process."""
        if self._native:
            try:
                done = mux_client.run(str(self.place.socket), command, stdin or b"", deadline)
                return _Outcome(done.exit_code, done.stdout, done.stderr, native=True)
            except mux_client.MuxUnsupported as exc:
                log.info("%s; running commands through ssh client processes instead", exc)
                self._native = False
            except mux_client.MuxUnavailable:
                raise self.login_required(f"cannot run {command[:200]!r}") from None
            except mux_client.MuxRefused as exc:
                if _session_refused(str(exc)) or "refused" in str(exc).lower():
                    return _Outcome(SSH_FAILURE, b"", str(exc).encode(), native=True,
                                    refused=True)
                raise TransportError(f"the shared login to {self.target.label} refused a "
                                     f"session for {command[:200]!r}: {exc}") from None
            except mux_client.MuxTimeout:
                raise CommandTimeout(f"{command[:200]!r} on {self.target.label} did not finish "
                                     "in time") from None
            except mux_client.MuxLost as exc:
                raise self.failure(command, f"{exc}; it may or may not have completed") from None
        proc = self.spawn(command)
        try:
            out, err = proc.communicate(stdin or b"", timeout=max(deadline - time.monotonic(),
                                                                  0.001))
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise CommandTimeout(f"{command[:200]!r} on {self.target.label} did not finish "
                                 "in time") from None
        refused = proc.returncode == SSH_FAILURE and _session_refused(
            err.decode("utf-8", "replace"))
        return _Outcome(proc.returncode, out, err, native=False, refused=refused)

    def open_stream(self, argv: Sequence[str]) -> OpenSSHStream:
        """Start ``argv`` as a long-lived stream (one session of the master while open)."""
        return OpenSSHStream(self, argv)

    def reserve_channel(self, timeout: float) -> bool:
        """Take one of the ``max_channels`` session slots of this process."""
        return self._channels.acquire(timeout=timeout)

    def release_channel(self) -> None:
        """Give back a slot taken with :meth:`reserve_channel`."""
        self._channels.release()



def _session_refused(stderr: str) -> bool:
    lowered = stderr.lower()
    return any(word in lowered for word in _SESSION_REFUSED)


def _mux_trouble(stderr: str) -> bool:
    lowered = stderr.lower()
    return any(word in lowered for word in _MUX_TROUBLE)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.communicate()


class OpenSSHStream:
    """A long-lived remote command as one session of the shared login
    (see :class:`~dagster_slurm.transport.base.Stream`)."""

    def __init__(self, transport: OpenSSHTransport, argv: Sequence[str]) -> None:
        self._owner = transport
        self._argv0 = argv[0]
        self._command = render_command(argv)
        if not transport.reserve_channel(transport.options.command_timeout):
            raise CommandTimeout(f"no free session to {transport.target.label} for a stream")
        self._released = False
        try:
            self._open(transport.options.command_timeout)
        except BaseException:
            self._release()
            raise

    def _start(self) -> None:
        self._proc = self._owner.spawn(f"echo {STREAM_OPEN}; exec {self._command}")
        assert self._proc.stdin is not None and self._proc.stdout is not None
        assert self._proc.stderr is not None
        self._out = self._proc.stdout.fileno()
        self._errfd = self._proc.stderr.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._errfd, False)
        self._lines = LineBuffer()
        self._err = bytearray()
        self._pending = 0
        self._out_eof = False

    def _open(self, limit: float) -> None:
        """Start the command and wait for the session to be open (the line
        :data:`STREAM_OPEN` comes first); a session the server refused (``MaxSessions``)
        is asked for again with back-off, for at most ``limit`` seconds."""
        refusals = _RefusedSessions(self._owner.target.label, repr(self._argv0), limit)
        while True:
            self._start()
            try:
                first = self._read_line(max(refusals.deadline - time.monotonic(), 0.001))
            except BaseException:
                self.close_process()
                raise
            if first.strip() == STREAM_OPEN.encode():
                return
            self._proc.wait(timeout=CHECK_TIMEOUT)
            self._drain_stderr()
            refused = self._proc.returncode == SSH_FAILURE and _session_refused(self.stderr_tail())
            self.close_process()
            if not refused:
                raise self._owner.failure(self._command, self.stderr_tail())
            refusals.wait()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._owner.release_channel()

    def send(self, data: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(data)
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            self._proc.wait(timeout=CHECK_TIMEOUT)
            if self._proc.returncode != SSH_FAILURE and self._owner.alive():
                raise RemoteProgramEnded(
                    f"{self._argv0!r} on {self._owner.target.label} had ended when a request "
                    "was written to it (the shared login is up); the request reached nobody"
                ) from None
            raise self._owner.failure(self._command, self.stderr_tail()) from None
        self._pending = len(data)

    def _drain_stderr(self) -> None:
        while True:
            try:
                chunk = os.read(self._errfd, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            if not chunk:
                return
            self._err = (self._err + chunk)[-8192:]

    def readline(self, timeout: float) -> bytes:
        line = self._read_line(timeout)
        if not line:
            return self._ended()
        self._owner.stats.record(self._argv0, self._pending, len(line))
        return line

    def _read_line(self, timeout: float) -> bytes:
        """The next line of output, ``b""`` at its end."""
        deadline = time.monotonic() + timeout
        while True:
            self._drain_stderr()
            line = self._lines.pop_line()
            if line is not None:
                return line
            if self._out_eof:
                return b""
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"no answer from {self._argv0!r} on "
                                     f"{self._owner.target.label} within {timeout:.0f} s")
            ready, _, _ = select.select([self._out, self._errfd], [], [], min(remaining, 1.0))
            if self._out in ready:
                try:
                    chunk = os.read(self._out, 65536)
                except BlockingIOError:
                    continue
                if chunk:
                    self._lines.feed(chunk)
                else:
                    self._out_eof = True

    def _ended(self) -> bytes:
        try:
            self._proc.wait(timeout=CHECK_TIMEOUT)
        except subprocess.TimeoutExpired:
            return b""
        self._drain_stderr()
        if self._proc.returncode == SSH_FAILURE and (_mux_trouble(self.stderr_tail())
                                                     or not self._owner.alive()):
            raise self._owner.failure(self._command, self.stderr_tail())
        return b""

    def stderr_tail(self) -> str:
        return self._err.decode("utf-8", "replace")

    def exit_code(self) -> int | None:
        return self._proc.poll()

    def close(self) -> None:
        try:
            self.close_process()
        finally:
            self._release()

    def close_process(self) -> None:
        """End the ssh client process of this stream (its session ends with it)."""
        stdin = self._proc.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            _kill(self._proc)
        for handle in (self._proc.stdout, self._proc.stderr):
            if handle is not None:
                handle.close()
