"""tail, write_file, mkdir and remove through the real agent program."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import AgentOpError
from dagster_slurm.agent.ops import mkdir_op, remove_op, tail_op, write_file_op
from dagster_slurm.agent.results import TailRequest


def test_tail_returns_raw_bytes_from_the_offset(client: AgentClient, tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_bytes("héllo wörld\n".encode())
    first = client.run(tail_op([TailRequest(str(log), 0, 2)])).files[0]
    assert (first.data, first.offset, first.size, first.eof) == (b"h\xc3", 2, 14, False)
    rest = client.run(tail_op([TailRequest(str(log), first.offset)])).files[0]
    assert first.data + rest.data == log.read_bytes() and rest.eof  # the split é survives


def test_tail_resumed_from_offsets_loses_and_repeats_nothing(
    client: AgentClient, tmp_path: Path
) -> None:
    log = tmp_path / "messages.jsonl"
    log.touch()
    received, offset = b"", 0
    for i in range(20):
        with log.open("ab") as f:
            f.write(f'{{"n": {i}, "text": "{"ü" * i}"}}\n'.encode())
        chunk = client.run(tail_op([TailRequest(str(log), offset, max_bytes=7)])).files[0]
        received += chunk.data
        offset = chunk.offset
        assert len(chunk.data) <= 7
    while True:
        chunk = client.run(tail_op([TailRequest(str(log), offset, max_bytes=4096)])).files[0]
        received += chunk.data
        offset = chunk.offset
        if chunk.eof:
            break
    assert received == log.read_bytes()


def test_tail_reports_missing_and_shrunken_files(client: AgentClient, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    missing, shrunk = client.run(
        tail_op([TailRequest(str(tmp_path / "nope"), 5), TailRequest(str(small), 10)])
    ).files
    assert (missing.exists, missing.size, missing.offset, missing.data) == (False, None, 5, b"")
    assert shrunk.exists and shrunk.truncated and shrunk.offset == 10 and shrunk.data == b""


def test_write_file_is_atomic_with_exact_mode(client: AgentClient, tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "script.sh"
    result = client.run(write_file_op(str(target), "#!/bin/sh\n", mode=0o750, makedirs=True))
    assert result.changed and target.read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    client.run(write_file_op(str(target), b"\x00\xff"))
    assert target.read_bytes() == b"\x00\xff"
    assert [p.name for p in target.parent.iterdir()] == ["script.sh"]  # no temp files left


def test_written_files_and_created_parents_are_private_by_default(
    client: AgentClient, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o755)
    target = tmp_path / "runs" / "run-1" / "step" / "pipes_context.json"
    client.run(write_file_op(str(target), "{}", makedirs=True))
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    for directory in (target.parent, target.parent.parent, tmp_path / "runs"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755  # an existing parent is left alone


def test_parent_mode_is_exact_whatever_the_umask(client: AgentClient, tmp_path: Path) -> None:
    shared = tmp_path / "store" / "envs" / "ready"
    client.run(write_file_op(str(shared), "x", mode=0o644, makedirs=True, dir_mode=0o775))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644
    for directory in (shared.parent, shared.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o775, directory


def test_write_file_without_parent_fails_cleanly(client: AgentClient, tmp_path: Path) -> None:
    with pytest.raises(AgentOpError) as info:
        client.run(write_file_op(str(tmp_path / "no" / "file"), "x"))
    assert info.value.type == "OSError"


def test_mkdir_creates_parents_and_tolerates_existing(client: AgentClient, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert client.run(mkdir_op(str(target))).changed
    assert target.is_dir()
    assert not client.run(mkdir_op(str(target))).changed


def test_mkdir_gives_every_created_parent_the_mode(client: AgentClient, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    client.run(mkdir_op(str(target), mode=0o700))
    for directory in (target, target.parent, target.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


def test_remove_files_and_trees_inside_root(client: AgentClient, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "job" / "sub").mkdir(parents=True)
    (root / "job" / "sub" / "f").write_text("x")
    (root / "file").write_text("x")
    assert client.run(remove_op(str(root / "job"), root=str(root))).changed
    assert client.run(remove_op(str(root / "file"), root=str(root))).changed
    assert not client.run(remove_op(str(root / "file"), root=str(root))).changed
    assert root.is_dir() and not list(root.iterdir())


@pytest.mark.parametrize("relative", ["..", ".", "../outside", "job/../../outside", ""])
def test_remove_refuses_paths_outside_root(
    client: AgentClient, tmp_path: Path, relative: str
) -> None:
    root = tmp_path / "root"
    (root / "job").mkdir(parents=True)
    (tmp_path / "outside").write_text("keep")
    with pytest.raises(AgentOpError) as info:
        client.run(
            remove_op(os.path.join(str(root), relative) if relative else str(root), root=str(root))
        )
    assert info.value.type in ("PathOutsideRoot", "BadRequest")
    assert (tmp_path / "outside").read_text() == "keep" and root.is_dir()


def test_remove_never_follows_symlinks_out_of_root(client: AgentClient, tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "precious").write_text("keep")
    (root / "link").symlink_to(outside)
    with pytest.raises(AgentOpError, match="not inside"):
        client.run(remove_op(str(root / "link" / "precious"), root=str(root)))
    assert client.run(remove_op(str(root / "link"), root=str(root))).changed
    assert not (root / "link").exists() and (outside / "precious").read_text() == "keep"


def test_a_created_document_gets_private_directories_unless_shared(
    client: AgentClient, tmp_path: Path
) -> None:
    from dagster_slurm.agent.ops import txn_op

    private = tmp_path / "sessions" / "run-1" / "allocation.json"
    client.run(txn_op(str(private), f"{private.parent}/lock", [], create={"a": 1}))
    assert stat.S_IMODE(private.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(private.parent.parent.stat().st_mode) == 0o700
    shared = tmp_path / "envs" / "leases.json"
    client.run(txn_op(str(shared), f"{shared}.lock", [], create={"leases": {}}, dir_mode=0o755))
    assert stat.S_IMODE(shared.parent.stat().st_mode) == 0o755
