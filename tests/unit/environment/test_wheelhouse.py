"""Building wheelhouses with a fake pip: cache use, platform arguments, fallbacks, hashes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from environment_support import CLUSTER, FakePip, make_wheel

from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.packing.pip import SOURCE_DATE_EPOCH, PipResult, missing_requirement
from dagster_slurm.environment.packing.pool import WheelPool
from dagster_slurm.environment.packing.requirements import DirectUrl, InstalledDistribution
from dagster_slurm.environment.packing.wheelhouse import build_wheelhouse

LOCAL_SAME = dataclasses.replace(CLUSTER, python_version=(3, 11, 7), libc_version=(2, 31))
LOCAL_OTHER = dataclasses.replace(CLUSTER, python_version=(3, 12, 4), abi="cp312")


def dists(*extra: InstalledDistribution) -> list[InstalledDistribution]:
    return [
        InstalledDistribution("dagster-pipes", "1.13.0"),
        InstalledDistribution("six", "1.17.0"),
        InstalledDistribution("pytest", "8.3.0"),
        *extra,
    ]


def build(tmp_path, pip, local=LOCAL_SAME, packages=None, distributions=None):
    return build_wheelhouse(
        packages,
        CLUSTER,
        local,
        tmp_path / "cache",
        distributions=dists() if distributions is None else distributions,
        pip=pip,
    )


def test_same_platform_uses_pip_wheel_once_then_only_the_cache(tmp_path: Path):
    pip = FakePip()
    house = build(tmp_path, pip)
    assert [w.filename for w in house.wheels] == [
        "dagster_pipes-1.13.0-py3-none-any.whl",
        "six-1.17.0-py3-none-any.whl",
    ]
    assert pip.commands() == ["wheel", "wheel"]  # the pins, then pip itself
    args = pip.calls[0][0]
    assert "--no-deps" in args and "--platform" not in args
    assert house.installer.name == "pip"
    again = FakePip()
    assert build(tmp_path, again).env_hash == house.env_hash
    assert again.calls == []


def test_other_platform_downloads_binary_wheels_with_the_cluster_tags(tmp_path: Path):
    pip = FakePip()
    build(tmp_path, pip, local=LOCAL_OTHER)
    args = pip.calls[0][0]
    assert args[0] == "download" and "--only-binary=:all:" in args and "--no-deps" in args
    assert args[args.index("--python-version") + 1] == "3.11"
    assert args[args.index("--abi") + 1] == "cp311"
    assert "manylinux_2_36_x86_64" in args


def test_only_missing_pins_are_fetched(tmp_path: Path):
    build(tmp_path, FakePip())
    pip = FakePip()
    house = build(tmp_path, pip, distributions=dists(InstalledDistribution("attrs", "25.1.0")))
    assert pip.requested == [["attrs==25.1.0"]]
    assert {w.name for w in house.wheels} == {"attrs", "dagster-pipes", "six"}


def test_a_pin_without_cluster_wheels_is_built_here_when_pure(tmp_path: Path):
    pip = FakePip(no_wheel=["six"])
    house = build(tmp_path, pip, local=LOCAL_OTHER)
    assert pip.commands() == ["download", "wheel", "download", "download"]
    assert pip.calls[1][0][-1] == "six==1.17.0"
    assert {w.name for w in house.wheels} == {"dagster-pipes", "six"}


def test_a_pin_without_cluster_wheels_that_builds_only_for_this_machine_is_refused(tmp_path: Path):
    pip = FakePip(no_wheel=["six"], impure=["six"])
    with pytest.raises(EnvironmentSetupError, match="not pure Python"):
        build(tmp_path, pip, local=LOCAL_OTHER)


def test_pip_failures_name_the_step_and_show_pips_output(tmp_path: Path):
    def failing(args, env):
        return PipResult(tuple(args), 2, "", "ERROR: network unreachable")

    with pytest.raises(EnvironmentSetupError, match="network unreachable"):
        build(tmp_path, failing)


def test_requirement_lists_resolve_with_dependencies_and_are_cached(tmp_path: Path):
    pip = FakePip(versions={"dagster-pipes": "1.13.0"})
    house = build(tmp_path, pip, packages=["six==1.17.0"])
    args = pip.calls[0][0]
    assert "--no-deps" not in args
    assert {w.name for w in house.wheels} == {"dagster-pipes", "six"}
    again = FakePip()
    assert build(tmp_path, again, packages=["six==1.17.0"]).env_hash == house.env_hash
    assert again.calls == []


def test_editable_projects_are_built_with_fixed_timestamps_and_cached_by_source(tmp_path: Path):
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "m.py").write_text("x = 1\n")
    editable = InstalledDistribution(
        "proj", "0.1", (), DirectUrl(project.as_uri(), "dir", editable=True)
    )
    pip = FakePip(sources={str(project): ("proj", "0.1")})
    house = build(tmp_path, pip, distributions=dists(editable))
    assert "proj" in {w.name for w in house.wheels}
    build_call = [c for c in pip.calls if c[0][-1] == str(project)]
    assert build_call and build_call[0][1] == {"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    again = FakePip(sources=pip.sources)
    build(tmp_path, again, distributions=dists(editable))
    assert again.calls == []
    (project / "src" / "m.py").write_text("x = 2\n")
    changed = FakePip(sources=pip.sources)
    build(tmp_path, changed, distributions=dists(editable))
    assert [c[0][-1] for c in changed.calls] == [str(project)]


def test_a_platform_specific_local_build_is_refused_for_another_platform(tmp_path: Path):
    project = tmp_path / "proj"
    project.mkdir()
    editable = InstalledDistribution("proj", "0.1", (), DirectUrl(project.as_uri(), "dir"))
    pip = FakePip(sources={str(project): ("proj", "0.1")}, impure=["proj"])
    with pytest.raises(EnvironmentSetupError, match="does not run on the cluster"):
        build(tmp_path, pip, local=LOCAL_OTHER, distributions=dists(editable))


def test_requirements_text_pins_every_wheel_with_its_hash(tmp_path: Path):
    house = build(tmp_path, FakePip())
    lines = house.requirements_text().splitlines()
    assert lines[0].startswith("dagster-pipes==1.13.0 --hash=sha256:")
    assert lines[0].endswith(house.wheels[0].sha256)
    assert not any(line.startswith("pip==") for line in lines)
    assert house.installer in house.files()


def test_env_hash_depends_on_wheel_content_only(tmp_path: Path):
    house = build(tmp_path / "a", FakePip())
    assert build(tmp_path / "b", FakePip()).env_hash == house.env_hash, "another cache, same bytes"
    assert build(tmp_path / "c", FakePip(salt="rebuilt")).env_hash != house.env_hash


def test_pool_forgets_entries_whose_files_are_gone(tmp_path: Path):
    pool = WheelPool(tmp_path / "pool")
    wheel = make_wheel(tmp_path / "in", "six", "1.17.0")
    [stored] = pool.put("pin:six==1.17.0", [wheel])
    assert pool.get("pin:six==1.17.0") == [stored]
    stored.path.unlink()
    assert pool.get("pin:six==1.17.0") is None
    assert pool.get("pin:unknown==1") is None


def test_missing_requirement_is_read_from_pips_error():
    assert (
        missing_requirement("ERROR: No matching distribution found for six==1.17.0\n")
        == "six==1.17.0"
    )
    assert missing_requirement("ERROR: something else") is None
