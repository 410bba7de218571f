"""Packets of the master's multiplexing protocol (pure; the real master is in the
integration tests)."""

from __future__ import annotations

import os
import select
import socket
import struct
import time

import pytest

from dagster_slurm.transport import mux_client as mux


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def _packet(kind: int, *words: int) -> bytes:
    body = struct.pack(">I", kind) + b"".join(struct.pack(">I", w) for w in words)
    return struct.pack(">I", len(body)) + body


def test_packets_are_read_whole_even_when_split():
    ours, theirs = _pair()
    reader = mux._Reader(ours)
    data = _packet(mux.MUX_S_SESSION_OPENED, 1, 9) + _packet(mux.MUX_S_EXIT_MESSAGE, 9, 3)
    theirs.sendall(data[:5])
    reader.feed()
    assert reader.packet() is None
    theirs.sendall(data[5:])
    reader.feed()
    assert reader.packet() == (mux.MUX_S_SESSION_OPENED, struct.pack(">II", 1, 9))
    assert mux._exit_status(reader) == 3


def test_a_closed_connection_without_an_exit_status_is_lost():
    ours, theirs = _pair()
    reader = mux._Reader(ours)
    theirs.close()
    reader.feed()
    with pytest.raises(mux.MuxLost):
        mux._exit_status(reader)


def test_a_refusal_carries_the_masters_reason():
    reason = b"Session open refused by peer"
    body = struct.pack(">I", 1) + struct.pack(">I", len(reason)) + reason
    assert mux._reason(body) == "Session open refused by peer"
    assert mux._reason(b"") == "no reason given"


def test_a_master_of_another_version_is_unsupported(tmp_path):
    path = str(tmp_path / "m.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    import threading

    def answer() -> None:
        conn, _ = server.accept()
        conn.sendall(_packet(mux.MUX_MSG_HELLO, 3))
        conn.recv(100)
        conn.close()

    thread = threading.Thread(target=answer)
    thread.start()
    with pytest.raises(mux.MuxUnsupported, match="version 3"):
        mux.alive_pid(path)
    thread.join(5)
    assert mux.alive_pid(str(tmp_path / "none.sock")) is None


def test_the_result_is_returned_once_output_and_status_are_in_without_waiting_on_nothing(
        monkeypatch):
    ours, theirs = _pair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    os.close(out_w)  # the command wrote nothing and ended: both outputs at EOF
    os.close(err_w)
    theirs.sendall(_packet(mux.MUX_S_EXIT_MESSAGE, 9, 4))
    real_select = select.select

    def select_something(r, w, x, timeout=None):  # noqa: ANN001, ANN202
        assert r or w, "waited on nothing (a wait of the whole poll timeout)"
        return real_select(r, w, x, timeout)

    monkeypatch.setattr(mux.select, "select", select_something)
    reader = mux._Reader(ours)
    result = mux._exchange(ours, reader, 9, in_w, out_r, err_r, b"", time.monotonic() + 10,
                           [in_w, out_r, err_r])
    assert (result.exit_code, result.stdout, result.stderr) == (4, b"", b"")
    for fd in (in_r, out_r, err_r):
        os.close(fd)
