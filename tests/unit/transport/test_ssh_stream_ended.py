"""An SSH stream whose command has ended says so, instead of paramiko's "Socket is closed",
when the connection itself is up; a lost connection is still a connection error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dagster_slurm.errors import RemoteProgramEnded, TransportError
from dagster_slurm.transport.ssh import SSHOptions, SSHStream


class _ClosedChannel:
    """A channel whose command has ended: paramiko refuses to write to it."""

    closed = True
    exit_status = -1

    def sendall(self, data: object) -> None:
        raise OSError("Socket is closed")

    def close(self) -> None:
        pass


class _Connection:
    """The parts of an SSHTransport a stream uses; ``up``: whether the connection is up."""

    def __init__(self, up: bool) -> None:
        self.up = up
        self.options = SSHOptions()
        self.target = SimpleNamespace(label="alice@login:22")
        self.released = 0

    def reserve_channel(self, timeout: float) -> bool:
        return True

    def release_channel(self) -> None:
        self.released += 1

    def open_channel(self, command: str) -> _ClosedChannel:
        return _ClosedChannel()

    def connected(self) -> bool:
        return self.up


def test_writing_to_an_ended_command_on_a_live_connection_says_the_command_ended() -> None:
    stream = SSHStream(_Connection(up=True), ["python3", "agent", "--serve"])  # type: ignore[arg-type]
    with pytest.raises(RemoteProgramEnded) as caught:
        stream.send(b"{}\n")
    assert str(caught.value) == (
        "'python3' on alice@login:22 had ended when a request was written to it (the SSH "
        "connection is up); the request reached nobody"
    )
    assert "Socket is closed" not in str(caught.value)


def test_writing_on_a_lost_connection_stays_a_connection_error() -> None:
    stream = SSHStream(_Connection(up=False), ["python3"])  # type: ignore[arg-type]
    with pytest.raises(TransportError) as caught:
        stream.send(b"{}\n")
    assert not isinstance(caught.value, RemoteProgramEnded)
    assert "may or may not have been received" in str(caught.value)
