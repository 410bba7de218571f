"""``write_file`` with ``wake``: one line to a FIFO after the write, never blocking and never
failing the write, through the real agent program (and :func:`wake_fifo` itself)."""

from __future__ import annotations

import os
import select
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import write_file_op
from dagster_slurm.agent.remote.files import wake_fifo


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "wake"
    os.mkfifo(path, 0o600)
    return path


@pytest.fixture
def reader(fifo: Path) -> Iterator[int]:
    """The FIFO held open for reading and writing, as the step server holds its wake FIFO."""
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        yield fd
    finally:
        os.close(fd)


def _pending(fd: int) -> bytes:
    """What the reader of ``fd`` can read now (nothing: b"")."""
    if not select.select([fd], [], [], 0)[0]:
        return b""
    return os.read(fd, 65536)


def test_a_request_written_with_wake_reaches_the_reader(
        client: AgentClient, tmp_path: Path, fifo: Path, reader: int) -> None:
    target = tmp_path / "requests" / "r1.request"
    result = client.run(write_file_op(str(target), "a\nb\n", makedirs=True, wake=str(fifo)))
    assert target.read_text() == "a\nb\n"
    assert result.woken is True
    assert _pending(reader) == b"\n"


@pytest.mark.parametrize("case", ["no reader", "missing", "regular file", "directory"])
def test_the_write_stands_whatever_the_wake_meets(
        client: AgentClient, tmp_path: Path, fifo: Path, case: str) -> None:
    wake = {"no reader": fifo, "missing": tmp_path / "gone",
            "regular file": tmp_path / "plain", "directory": tmp_path}[case]
    if case == "regular file":
        wake.write_text("keep")
    target = tmp_path / "r1.cancel"
    result = client.run(write_file_op(str(target), "\n", wake=str(wake)))
    assert target.read_text() == "\n"
    assert result.woken is False
    if case == "regular file":
        assert wake.read_text() == "keep"  # never written to


def test_without_wake_nothing_is_reported(client: AgentClient, tmp_path: Path) -> None:
    assert client.run(write_file_op(str(tmp_path / "f"), "x")).woken is None


def test_a_full_pipe_does_not_block_and_counts_as_woken(fifo: Path, reader: int) -> None:
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(BlockingIOError):
            while True:
                os.write(writer, b"\n" * 4096)
    finally:
        os.close(writer)
    assert wake_fifo(str(fifo)) == (True, "pending")


def test_no_reader_on_this_host_is_said_in_words(fifo: Path) -> None:
    assert wake_fifo(str(fifo)) == (False, "no reader on this host")


def test_a_symlink_to_a_fifo_is_not_followed(tmp_path: Path, fifo: Path, reader: int) -> None:
    link = tmp_path / "link"
    link.symlink_to(fifo)
    assert wake_fifo(str(link)) == (False, "not a FIFO")
    assert _pending(reader) == b""
