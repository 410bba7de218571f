"""Which distributions of the current environment are packed, and how."""

from __future__ import annotations

import json

import pytest
from environment_support import CLUSTER

from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.packing.requirements import (
    DirectUrl,
    InstalledDistribution,
    Pin,
    installed_distributions,
    is_excluded,
    parse_direct_url,
    requirement_names,
    requirements_with_pipes,
    select_from_environment,
)

MARKERS = CLUSTER.marker_environment()
EDITABLE = DirectUrl("file:///work/proj", "dir", editable=True)


def dist(name, version="1.0", requires=(), direct=None):
    return InstalledDistribution(name, version, tuple(requires), direct)


@pytest.mark.parametrize(
    "name",
    [
        "pip",
        "setuptools",
        "wheel",
        "pytest",
        "pytest-timeout",
        "pytest_cov",
        "ruff",
        "mypy",
        "hypothesis",
        "mkdocs",
        "mkdocs-material",
        "mkdocstrings-python",
        "types-requests",
        "Sphinx",
    ],
)
def test_tools_are_excluded(name):
    assert is_excluded(name)


@pytest.mark.parametrize(
    "name", ["dagster", "dagster-pipes", "numpy", "pytz", "mypy-extensions", "wheelhouse-x"]
)
def test_libraries_are_kept(name):
    assert not is_excluded(name)


def test_selection_pins_versions_and_drops_tools():
    selection = select_from_environment(
        [
            dist("dagster-pipes", "1.13.0"),
            dist("Six", "1.17.0"),
            dist("pytest", "8.0"),
            dist("pip", "24.0"),
        ],
        MARKERS,
    )
    assert selection.pins == (Pin("dagster-pipes", "1.13.0"), Pin("six", "1.17.0"))
    assert selection.excluded == ("pip", "pytest")
    assert selection.local == ()
    assert str(selection.pins[0]) == "dagster-pipes==1.13.0"


def test_an_excluded_tool_that_a_kept_distribution_requires_is_kept_with_its_requirements():
    selection = select_from_environment(
        [
            dist("dagster-pipes"),
            dist("legacy-lib", requires=["setuptools>=40", "pytest; extra == 'test'"]),
            dist("setuptools", "70.0", requires=["wheel"]),
            dist("wheel", "0.43"),
            dist("pytest", "8.0"),
        ],
        MARKERS,
    )
    assert {p.name for p in selection.pins} == {
        "dagster-pipes",
        "legacy-lib",
        "setuptools",
        "wheel",
    }
    assert selection.excluded == ("pytest",)


def test_requirements_whose_markers_do_not_apply_to_the_cluster_are_ignored():
    requires = ["mypy; python_version < '3.8'", "ruff; sys_platform == 'win32'", "pip>=20"]
    assert requirement_names(requires, MARKERS) == ["pip"]
    assert requirement_names(["not a requirement !!"], MARKERS) == []


def test_local_and_vcs_installs_are_built_here_and_the_first_of_a_name_wins():
    vcs = DirectUrl("https://example.invalid/repo.git", "vcs", vcs="git", commit="abc123")
    selection = select_from_environment(
        [
            dist("dagster-pipes"),
            dist("proj", "0.1", direct=EDITABLE),
            dist("proj", "0.0.9"),
            dist("fromgit", "2.0", direct=vcs),
        ],
        MARKERS,
    )
    assert [s.name for s in selection.local] == ["fromgit", "proj"]
    assert selection.local[1].version == "0.1"
    assert [p.name for p in selection.pins] == ["dagster-pipes"]


def test_an_environment_without_dagster_pipes_is_refused():
    with pytest.raises(EnvironmentSetupError, match="dagster-pipes"):
        select_from_environment([dist("numpy")], MARKERS)


def test_direct_url_parsing_and_source_specs():
    editable = parse_direct_url(
        json.dumps({"url": "file:///work/my%20proj", "dir_info": {"editable": True}})
    )
    assert editable == DirectUrl("file:///work/my%20proj", "dir", editable=True)
    assert editable.source_spec() == "/work/my proj" and editable.local_path == "/work/my proj"
    sub = parse_direct_url(
        json.dumps({"url": "file:///mono", "dir_info": {}, "subdirectory": "pkg"})
    )
    assert sub.source_spec() == "/mono/pkg"
    vcs = parse_direct_url(
        json.dumps({"url": "https://h/r.git", "vcs_info": {"vcs": "git", "commit_id": "deadbeef"}})
    )
    assert vcs.source_spec() == "git+https://h/r.git@deadbeef" and vcs.local_path is None
    archive = parse_direct_url(json.dumps({"url": "https://h/p-1.0.tar.gz", "archive_info": {}}))
    assert archive.source_spec() == "https://h/p-1.0.tar.gz"
    assert parse_direct_url(None) is None
    assert parse_direct_url("not json") is None
    assert parse_direct_url("[]") is None


def test_requirement_lists_get_dagster_pipes_unless_they_name_it():
    assert requirements_with_pipes(["numpy==2.1.0"], "1.13.0") == (
        "numpy==2.1.0",
        "dagster-pipes==1.13.0",
    )
    assert requirements_with_pipes(["numpy"], None) == ("numpy", "dagster-pipes")
    assert requirements_with_pipes(["Dagster_Pipes>=1.9"], "1.13.0") == ("Dagster_Pipes>=1.9",)
    with pytest.raises(EnvironmentSetupError, match="not a requirement"):
        requirements_with_pipes(["numpy=="], None)


def test_this_environment_is_read_with_the_editable_project_as_a_local_source():
    found = {d.name: d for d in installed_distributions()}
    assert "dagster-pipes" in found
    project = found["dagster-slurm"]
    selection = select_from_environment(installed_distributions(), MARKERS)
    if project.direct_url is not None:
        assert "dagster-slurm" in {s.name for s in selection.local}
    assert "pytest" in selection.excluded
