"""The file sources: the agent's tail op and direct local reads answer alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.results import TailRequest
from dagster_slurm.pipes.sources import (
    AgentFileSource,
    FileSource,
    LocalFileSource,
    read_local_chunk,
)


def _scenario(tmp_path: Path) -> list[TailRequest]:
    (tmp_path / "full.txt").write_bytes(b"0123456789")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short.txt").write_bytes(b"abc")
    return [
        TailRequest(str(tmp_path / "full.txt"), 0, 4),  # first part
        TailRequest(str(tmp_path / "full.txt"), 4, 100),  # the rest, reaching eof
        TailRequest(str(tmp_path / "full.txt"), 10, 100),  # at the end: nothing new
        TailRequest(str(tmp_path / "empty.txt"), 0, 100),
        TailRequest(str(tmp_path / "short.txt"), 5, 100),  # shrank below the offset
        TailRequest(str(tmp_path / "missing.txt"), 0, 100),
    ]


def test_agent_and_local_sources_answer_alike(tmp_path: Path, agent_client: AgentClient) -> None:
    requests = _scenario(tmp_path)
    remote = AgentFileSource(agent_client).read(requests)
    local = LocalFileSource().read(requests)
    assert remote == local
    first, rest, at_end, empty, shrunk, missing = local
    assert (first.data, first.offset, first.eof, first.size) == (b"0123", 4, False, 10)
    assert (rest.data, rest.offset, rest.eof) == (b"456789", 10, True)
    assert (at_end.data, at_end.offset, at_end.eof) == (b"", 10, True)
    assert (empty.exists, empty.data, empty.eof) == (True, b"", True)
    assert (shrunk.truncated, shrunk.size, shrunk.offset, shrunk.data) == (True, 3, 5, b"")
    assert (missing.exists, missing.size, missing.eof, missing.error) == (False, None, True, None)


def test_agent_source_reads_all_files_in_one_round_trip(
    tmp_path: Path, agent_client: AgentClient
) -> None:
    requests = _scenario(tmp_path)
    source = AgentFileSource(agent_client)
    source.read(requests)  # the first call also installs the agent program
    stats = agent_client.transport.stats
    before = stats.round_trips
    source.read(requests)
    source.read(requests[:2])
    assert stats.round_trips - before == 2
    assert source.read([]) == [] and stats.round_trips - before == 2


def test_unreadable_file_is_reported_per_file(tmp_path: Path, source: FileSource) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    (tmp_path / "ok.txt").write_bytes(b"fine\n")
    bad, ok = source.read([TailRequest(str(directory)), TailRequest(str(tmp_path / "ok.txt"))])
    assert bad.error and bad.data == b"" and bad.offset == 0
    assert ok.data == b"fine\n" and ok.error is None


@pytest.mark.parametrize("source_type", [AgentFileSource, LocalFileSource])
def test_sources_satisfy_the_protocol(source_type: type, agent_client: AgentClient) -> None:
    source = source_type(agent_client) if source_type is AgentFileSource else source_type()
    assert isinstance(source, FileSource)
    assert type(source).__name__ in repr(source)


def test_reads_from_an_offset_and_says_where_the_next_read_starts(tmp_path):
    path = tmp_path / "out.log"
    path.write_bytes(b"first line\nlast line\n")
    chunk = read_local_chunk(TailRequest(str(path), 6, 5))
    assert (chunk.data, chunk.offset, chunk.eof) == (b"line\n", 11, False)


def test_a_negative_offset_reads_the_end_as_the_agent_does(tmp_path):
    path = tmp_path / "out.log"
    path.write_bytes(b"first line\nlast line\n")
    assert read_local_chunk(TailRequest(str(path), -10)).data == b"last line\n"
    assert read_local_chunk(TailRequest(str(path), -1000)).data == b"first line\nlast line\n"


def test_a_missing_file_is_empty_and_at_its_end(tmp_path):
    chunk = read_local_chunk(TailRequest(str(tmp_path / "none"), 0))
    assert not chunk.exists and chunk.data == b"" and chunk.eof
