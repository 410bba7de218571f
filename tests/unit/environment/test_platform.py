"""Which wheel tags and pip arguments the cluster's Python probe leads to."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from environment_support import CLUSTER

from dagster_slurm.environment.cluster.platform import (
    local_builds_fit,
    local_platform,
    manylinux_tags,
    musllinux_tags,
    parse_probe,
    probe_source,
)
from dagster_slurm.environment.errors import EnvironmentSetupError

PYTHON38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"

DEBIAN = {
    "python_version": [3, 11, 2],
    "implementation": "cpython",
    "abiflags": "",
    "soabi": "cpython-311-x86_64-linux-gnu",
    "platform": "linux-x86_64",
    "machine": "x86_64",
    "pointer_bits": 64,
    "glibc": "2.36",
    "musl": None,
    "executable": "/usr/bin/python3",
}


def test_debian_probe_gives_the_cluster_platform():
    assert parse_probe(DEBIAN) == CLUSTER


def test_manylinux_tags_run_from_the_glibc_down_with_legacy_aliases_after_their_twins():
    tags = manylinux_tags((2, 36), "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert tags[-2:] == ["manylinux_2_5_x86_64", "manylinux1_x86_64"]
    i = tags.index("manylinux_2_17_x86_64")
    assert tags[i + 1] == "manylinux2014_x86_64"
    j = tags.index("manylinux_2_12_x86_64")
    assert tags[j + 1] == "manylinux2010_x86_64"
    assert len(tags) == 32 + 3


def test_aarch64_starts_at_glibc_2_17_and_has_only_the_2014_alias():
    tags = manylinux_tags((2, 28), "aarch64")
    assert tags[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert not any("2010" in t or "manylinux1" in t for t in tags)


def test_musl_tags_and_platform():
    assert musllinux_tags((1, 2), "x86_64") == [
        "musllinux_1_2_x86_64",
        "musllinux_1_1_x86_64",
        "musllinux_1_0_x86_64",
    ]
    alpine = parse_probe({**DEBIAN, "glibc": None, "musl": "1.2"})
    assert alpine.platform_tags() == (
        "musllinux_1_2_x86_64",
        "musllinux_1_1_x86_64",
        "musllinux_1_0_x86_64",
        "linux_x86_64",
    )


def test_pip_target_args_name_implementation_version_abi_and_every_platform():
    args = CLUSTER.pip_target_args()
    assert args[:6] == ["--implementation", "cp", "--python-version", "3.11", "--abi", "cp311"]
    platforms = args[7::2]
    assert args[6::2] == ["--platform"] * len(platforms)
    assert platforms[0] == "manylinux_2_36_x86_64" and platforms[-1] == "linux_x86_64"


def test_free_threaded_pypy_and_32_bit_interpreters():
    assert parse_probe({**DEBIAN, "python_version": [3, 13, 1], "abiflags": "t"}).abi == "cp313t"
    pypy = parse_probe(
        {**DEBIAN, "implementation": "pypy", "soabi": "pypy310-pp73-x86_64-linux-gnu"}
    )
    assert pypy.abi == "pypy310_pp73_x86_64_linux_gnu"
    assert pypy.pip_target_args()[:2] == ["--implementation", "pp"]
    assert parse_probe({**DEBIAN, "pointer_bits": 32}).arch == "i686"
    assert (
        parse_probe({**DEBIAN, "platform": "linux-aarch64", "machine": "aarch64"}).arch == "aarch64"
    )


def test_non_linux_clusters_are_refused_with_a_hint():
    mac = parse_probe({**DEBIAN, "platform": "macosx-14.0-arm64", "glibc": None})
    with pytest.raises(EnvironmentSetupError, match="pre_deployed_env_path"):
        mac.pip_target_args()


def test_unreadable_probe_answers_raise():
    with pytest.raises(EnvironmentSetupError):
        parse_probe({"implementation": "cpython"})
    with pytest.raises(EnvironmentSetupError):
        parse_probe({**DEBIAN, "glibc": "two"})


def test_marker_environment_of_the_cluster():
    markers = CLUSTER.marker_environment()
    assert markers["python_version"] == "3.11"
    assert markers["python_full_version"] == "3.11.2"
    assert markers["sys_platform"] == "linux" and markers["platform_system"] == "Linux"
    assert markers["platform_python_implementation"] == "CPython"


def test_key_ignores_micro_version_and_path_but_not_glibc():
    same = dataclasses.replace(CLUSTER, python_version=(3, 11, 9), executable="/opt/py/bin/python3")
    assert same.key() == CLUSTER.key()
    assert dataclasses.replace(CLUSTER, libc_version=(2, 28)).key() != CLUSTER.key()


def test_local_builds_fit_only_when_tags_match_and_local_glibc_is_not_newer():
    assert local_builds_fit(dataclasses.replace(CLUSTER, python_version=(3, 11, 7)), CLUSTER)
    assert local_builds_fit(dataclasses.replace(CLUSTER, libc_version=(2, 31)), CLUSTER)
    assert not local_builds_fit(dataclasses.replace(CLUSTER, libc_version=(2, 39)), CLUSTER)
    assert not local_builds_fit(
        dataclasses.replace(CLUSTER, python_version=(3, 12, 1), abi="cp312"), CLUSTER
    )
    assert not local_builds_fit(dataclasses.replace(CLUSTER, arch="aarch64"), CLUSTER)
    assert not local_builds_fit(
        dataclasses.replace(CLUSTER, libc="musl", libc_version=(1, 2)), CLUSTER
    )


def test_probe_program_describes_this_interpreter_like_the_local_function(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, "-I", "-c", probe_source()], capture_output=True, text=True, check=True
    )
    remote = parse_probe(json.loads(out.stdout))
    local = local_platform()
    assert remote == dataclasses.replace(local, executable=remote.executable)
    assert local.interpreter_tag == f"cp{sys.version_info[0]}{sys.version_info[1]}"


@pytest.mark.skipif(not Path(PYTHON38).exists(), reason="no Python 3.8 here")
def test_probe_program_runs_on_python_3_8():
    out = subprocess.run(
        [PYTHON38, "-I", "-c", probe_source()], capture_output=True, text=True, check=True
    )
    platform = parse_probe(json.loads(out.stdout))
    assert platform.abi == "cp38" and platform.python_version[:2] == (3, 8)
