"""pixi detection, the pixi-pack command line and caching, against a stand-in pixi-pack."""

from __future__ import annotations

import dataclasses
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from environment_support import CLUSTER

from dagster_slurm.environment.config import EnvironmentConfig
from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.packing import pixi
from dagster_slurm.environment.packing.packer import choose_packer

# Records its argv next to the output file and writes a self-extracting stand-in there.
FAKE_PIXI_PACK = f"""#!{sys.executable}
import sys
from pathlib import Path

args = sys.argv[1:]
out = Path(args[args.index("--output-file") + 1])
out.write_text("#!/bin/sh\\n# packed " + " ".join(args) + "\\n")
(out.parent / "argv.txt").write_text("\\n".join(args))
log = Path(__file__).with_name("calls.log")
log.write_text(log.read_text() + "x" if log.exists() else "x")
"""


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("pixi-pack", FAKE_PIXI_PACK), ("pixi", "#!/bin/sh\nexit 0\n")):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


@pytest.fixture
def project(tmp_path: Path) -> pixi.PixiProject:
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "pixi.toml").write_text('[workspace]\nname = "proj"\n')
    (root / "pixi.lock").write_text("packages:\n- pypi: dagster-pipes\n")
    found = pixi.find_pixi_project(root / "src")
    assert found is not None
    return found


def test_tools_are_detected_on_path(fake_tools: Path, monkeypatch: pytest.MonkeyPatch):
    assert pixi.pixi_tools_available()
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not pixi.pixi_tools_available()
    assert not pixi.pixi_tools_available(lambda name: "/x" if name == "pixi" else None)


def test_projects_are_found_upwards_by_pixi_toml_or_pyproject_table(tmp_path: Path, project):
    assert project.manifest.name == "pixi.toml"
    assert project.lockfile == project.manifest.with_name("pixi.lock")
    other = tmp_path / "py"
    (other / "pkg").mkdir(parents=True)
    (other / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.pixi.workspace]\n')
    assert pixi.find_pixi_project(other / "pkg").manifest == other / "pyproject.toml"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert pixi.find_pixi_project(plain) is None


def test_pack_command_and_unpack_argv(project):
    out = Path("/cache/environment.sh")
    assert pixi.pack_command(dataclasses.replace(project, environment="prod"), "linux-64", out) == [
        "pixi-pack",
        "--environment",
        "prod",
        "--platform",
        "linux-64",
        "--create-executable",
        "--output-file",
        "/cache/environment.sh",
        str(project.manifest),
    ]
    assert pixi.unpack_argv("/b/environment.sh", "/b") == [
        "bash",
        "/b/environment.sh",
        "--output-directory",
        "/b",
        "--env-name",
        "env",
    ]


def test_conda_platforms():
    assert pixi.conda_platform(CLUSTER) == "linux-64"
    assert pixi.conda_platform(dataclasses.replace(CLUSTER, arch="aarch64")) == "linux-aarch64"
    with pytest.raises(EnvironmentSetupError):
        pixi.conda_platform(dataclasses.replace(CLUSTER, os="macosx"))


def test_packing_runs_the_pixi_pack_on_path_once_per_lock(
    fake_tools: Path, project, tmp_path: Path
):
    pack = pixi.build_pixi_pack(project, CLUSTER, tmp_path / "cache")
    assert pack.script.name == "environment.sh" and pack.conda_platform == "linux-64"
    argv = (pack.script.parent / "argv.txt").read_text().splitlines()
    assert argv[:4] == ["--environment", "default", "--platform", "linux-64"]
    assert argv[-1] == str(project.manifest)
    again = pixi.build_pixi_pack(project, CLUSTER, tmp_path / "cache")
    assert again == pack and (fake_tools / "calls.log").read_text() == "x"
    project.lockfile.write_text("packages:\n- pypi: dagster-pipes==1.13\n")
    changed = pixi.build_pixi_pack(project, CLUSTER, tmp_path / "cache")
    assert changed.script != pack.script and (fake_tools / "calls.log").read_text() == "xx"
    assert changed.env_hash != pack.env_hash


def test_missing_lock_and_failing_pixi_pack_are_reported(project, tmp_path: Path):
    def failing(argv):
        return subprocess.CompletedProcess(argv, 3, "", "solve error")

    with pytest.raises(EnvironmentSetupError, match="solve error"):
        pixi.build_pixi_pack(project, CLUSTER, tmp_path / "cache", run=failing)
    assert not [p for p in (tmp_path / "cache" / "pixi").iterdir() if p.is_dir()]
    project.lockfile.unlink()
    with pytest.raises(EnvironmentSetupError, match="pixi lock"):
        pixi.build_pixi_pack(project, CLUSTER, tmp_path / "cache", run=failing)


def test_choose_packer_policy(project):
    auto = EnvironmentConfig()
    assert choose_packer(auto, project, tools_available=True) == "pixi"
    assert choose_packer(auto, project, tools_available=False) == "wheelhouse"
    assert choose_packer(auto, None, tools_available=True) == "wheelhouse"
    assert choose_packer(EnvironmentConfig(env_packages=["six"]), project, True) == "wheelhouse"
    assert choose_packer(EnvironmentConfig(env_packer="wheelhouse"), project, True) == "wheelhouse"
    with pytest.raises(EnvironmentSetupError, match="PATH"):
        choose_packer(EnvironmentConfig(env_packer="pixi"), project, tools_available=False)
    with pytest.raises(EnvironmentSetupError, match="pixi.toml"):
        choose_packer(EnvironmentConfig(env_packer="pixi"), None, tools_available=True)
