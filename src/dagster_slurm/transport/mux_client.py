"""A client of OpenSSH's multiplexing protocol (``PROTOCOL.mux`` in OpenSSH), for one command.

Starting ``ssh`` as a client of the master costs a process and its start-up for every
command (about 5 ms against 2 ms for a command on an open connection). This module speaks
the master's control-socket protocol itself: a hello, a ``MUX_C_NEW_SESSION`` request whose
standard input, output and error are pipes of ours passed as file descriptors, and the
``MUX_S_EXIT_MESSAGE`` with the exit status. It is the passenger mode ``ssh`` itself uses.

Failures are typed so that the caller can decide: :class:`MuxUnavailable` (no master
answers on the socket: nothing ran), :class:`MuxRefused` (the master or the server refused
the session, e.g. ``MaxSessions``: nothing ran), :class:`MuxUnsupported` (a master speaking
another protocol version: use ``ssh`` instead), :class:`MuxLost` (the control connection
ended before the exit status: the command may or may not have run).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from dataclasses import dataclass

MUX_MSG_HELLO = 0x00000001
MUX_C_NEW_SESSION = 0x10000002
MUX_C_ALIVE_CHECK = 0x10000004
MUX_S_OK = 0x80000001
MUX_S_PERMISSION_DENIED = 0x80000002
MUX_S_FAILURE = 0x80000003
MUX_S_EXIT_MESSAGE = 0x80000004
MUX_S_ALIVE = 0x80000005
MUX_S_SESSION_OPENED = 0x80000006
MUX_S_TTY_ALLOC_FAIL = 0x80000008
PROTOCOL_VERSION = 4
NO_ESCAPE_CHAR = 0xFFFFFFFF

_CHUNK = 65536


class MuxError(Exception):
    """Base of this module's errors."""


class MuxUnavailable(MuxError):
    """No master answers on the control socket (missing, stale, or not a master)."""


class MuxUnsupported(MuxError):
    """The master speaks a protocol version this client does not."""


class MuxRefused(MuxError):
    """The session was refused (by the master, or by the server: ``MaxSessions``)."""


class MuxLost(MuxError):
    """The control connection ended before the command's exit status arrived."""


class MuxTimeout(MuxError):
    """The command did not end before the deadline (its session is closed)."""


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _packet(*parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I", len(body)) + body


def _u32(value: int) -> bytes:
    return struct.pack(">I", value)


class _Reader:
    """Reads the master's packets from the control socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.closed = False

    def feed(self) -> None:
        data = self.sock.recv(_CHUNK)
        if not data:
            self.closed = True
        self.buffer += data

    def packet(self) -> tuple[int, bytes] | None:
        """The next complete packet (type, body after the type), or None."""
        if len(self.buffer) < 8:
            return None
        (length,) = struct.unpack(">I", self.buffer[:4])
        if len(self.buffer) < 4 + length:
            return None
        body = bytes(self.buffer[4:4 + length])
        del self.buffer[:4 + length]
        (kind,) = struct.unpack(">I", body[:4])
        return kind, body[4:]

    def wait_packet(self, deadline: float) -> tuple[int, bytes]:
        while True:
            found = self.packet()
            if found is not None:
                return found
            if self.closed:
                raise MuxLost("the master closed the control connection")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MuxTimeout("no answer from the master in time")
            ready, _, _ = select.select([self.sock], [], [], remaining)
            if ready:
                self.feed()


def _reason(body: bytes) -> str:
    if len(body) < 8:
        return "no reason given"
    (size,) = struct.unpack(">I", body[4:8])
    return body[8:8 + size].decode("utf-8", "replace")


def _connect(path: str, deadline: float) -> tuple[socket.socket, _Reader]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.connect(path)
        sock.settimeout(None)
        sock.sendall(_packet(_u32(MUX_MSG_HELLO), _u32(PROTOCOL_VERSION)))
        reader = _Reader(sock)
        kind, body = reader.wait_packet(deadline)
    except (FileNotFoundError, ConnectionRefusedError, MuxLost) as exc:
        sock.close()
        raise MuxUnavailable(f"no master answers on {path}: {exc}") from None
    except OSError as exc:
        sock.close()
        raise MuxUnavailable(f"cannot reach the master on {path}: {exc}") from None
    except BaseException:
        sock.close()
        raise
    version = struct.unpack(">I", body[:4])[0] if len(body) >= 4 else None
    if kind != MUX_MSG_HELLO or version != PROTOCOL_VERSION:
        sock.close()
        raise MuxUnsupported(f"the master on {path} answered type {kind:#x} version {version}")
    return sock, reader


def alive_pid(path: str, timeout: float = 5.0) -> int | None:
    """The master's pid when one answers on ``path``; None when none does. Raises
    :class:`MuxUnsupported` for a master speaking another protocol version."""
    deadline = time.monotonic() + timeout
    try:
        sock, reader = _connect(path, deadline)
    except (MuxUnavailable, MuxTimeout):
        return None  # MuxUnsupported propagates: the caller asks another way
    with sock:
        sock.sendall(_packet(_u32(MUX_C_ALIVE_CHECK), _u32(1)))
        try:
            kind, body = reader.wait_packet(deadline)
        except MuxError:
            return None
        if kind != MUX_S_ALIVE or len(body) < 8:
            return None
        return struct.unpack(">I", body[4:8])[0]


@dataclass(frozen=True)
class MuxResult:
    """A command's exit status and output."""

    exit_code: int
    stdout: bytes
    stderr: bytes


def run(path: str, command: str, stdin: bytes, deadline: float) -> MuxResult:
    """Run ``command`` as a new session of the master on ``path`` (see the module docstring)."""
    sock, reader = _connect(path, deadline)
    ours: list[int] = []
    try:
        sock.sendall(_packet(
            # PROTOCOL.mux calls the four flags "bool"; OpenSSH's master reads each as a
            # uint32, as its own client sends them
            _u32(MUX_C_NEW_SESSION), _u32(1), _string(b""), _u32(0), _u32(0), _u32(0), _u32(0),
            _u32(NO_ESCAPE_CHAR), _string(b""),
            _string(command.encode()),
        ))
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ours = [in_w, out_r, err_r]
        for fd in (in_r, out_w, err_w):
            socket.send_fds(sock, [b"\0"], [fd])
            os.close(fd)
        session = _opened(reader, deadline)
        return _exchange(sock, reader, session, in_w, out_r, err_r, stdin, deadline, ours)
    finally:
        for fd in ours:
            try:
                os.close(fd)
            except OSError:
                pass
        sock.close()


def _opened(reader: _Reader, deadline: float) -> int:
    while True:
        kind, body = reader.wait_packet(deadline)
        if kind == MUX_S_SESSION_OPENED and len(body) >= 8:
            return struct.unpack(">I", body[4:8])[0]
        if kind in (MUX_S_FAILURE, MUX_S_PERMISSION_DENIED):
            raise MuxRefused(_reason(body))
        if kind != MUX_S_OK:
            raise MuxLost(f"unexpected answer {kind:#x} to a new session")


def _exit_status(reader: _Reader) -> int | None:
    """The exit status once the master sent it (other packets are skipped); None until
    then. Raises :class:`MuxLost` when the connection ended without one."""
    while (found := reader.packet()) is not None:
        kind, body = found
        if kind == MUX_S_EXIT_MESSAGE and len(body) >= 8:
            return struct.unpack(">I", body[4:8])[0]
    if reader.closed:
        raise MuxLost("the master ended the session without an exit status")
    return None


class _Input:
    """The command's standard input: written as the pipe takes it, then closed (EOF)."""

    def __init__(self, fd: int, data: bytes, ours: list[int]) -> None:
        self.fd, self.pending, self.ours = fd, memoryview(data), ours
        if not data:
            self.close()

    def close(self) -> None:
        os.close(self.fd)
        self.ours.remove(self.fd)
        self.fd = -1

    def write_some(self) -> None:
        written = os.write(self.fd, self.pending[:_CHUNK])
        self.pending = self.pending[written:]
        if not self.pending:
            self.close()


def _exchange(sock: socket.socket, reader: _Reader, session: int, in_w: int, out_r: int,
              err_r: int, stdin: bytes, deadline: float, ours: list[int]) -> MuxResult:
    feed = _Input(in_w, stdin, ours)
    out, err = bytearray(), bytearray()
    readers = {out_r: out, err_r: err}
    exit_code: int | None = None
    while True:
        if exit_code is None:
            exit_code = _exit_status(reader)
        if exit_code is not None and not readers:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MuxTimeout(f"session {session} did not end in time")
        wanted = [*readers, *([sock] if exit_code is None else [])]
        ready, writable, _ = select.select(wanted, [feed.fd] if feed.fd >= 0 else [], [],
                                           min(remaining, 1.0))
        if writable:
            feed.write_some()
        for fd in ready:
            if fd is sock:
                reader.feed()
            elif data := os.read(fd, _CHUNK):
                readers[fd] += data
            else:
                del readers[fd]
    return MuxResult(exit_code, bytes(out), bytes(err))
