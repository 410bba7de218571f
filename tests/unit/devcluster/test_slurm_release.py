"""A second Slurm release for the dev cluster: which root a release needs on which machine,
the commands that build it, when a cached root counts as complete, what every process in
it sees of the machine, and how the settings remember the choice."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from dagster_slurm.devcluster import release as releases
from dagster_slurm.devcluster.daemons import build_specs
from dagster_slurm.devcluster.errors import DevClusterError, InstallError
from dagster_slurm.devcluster.info import CLIENT_BIN_ENV, DevClusterInfo, slurm_command
from dagster_slurm.devcluster.layout import record_settings, resolve_settings
from dagster_slurm.devcluster.probes import ClusterProbes

ROOTS = Path("/var/cache/dagster-slurm/roots")
#: The real detection (the fixture below replaces it for everything else).
HOST_SUITE = releases.host_suite


@pytest.fixture(autouse=True)
def _bookworm_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings resolve as on a Debian 12 machine, whatever this one is."""
    monkeypatch.setattr(releases, "host_suite", lambda *args: "bookworm")
    for name in (releases.RELEASE_ENV, "DAGSTER_SLURM_TEST_ENV_PATH",
                 "DAGSTER_SLURM_TEST_RAY_ENV_PATH", "DAGSTER_SLURM_DEV_PORT_OFFSET"):
        monkeypatch.delenv(name, raising=False)


# -- which root ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "release"), [
    ("24.11", "24.11"), (" 22.05 ", "22.05"), ("native", ""), ("", ""), (None, "")])
def test_release_names(text: str | None, release: str) -> None:
    assert releases.parse_release(text) == release


def test_an_unknown_release_is_refused_with_the_choices() -> None:
    with pytest.raises(DevClusterError, match=r"23\.02.*22\.05, 24\.11"):
        releases.parse_release("23.02")


@pytest.mark.parametrize(("machine", "release", "root"), [
    ("bookworm", "24.11", ROOTS / "trixie"),
    ("bookworm", "22.05", None),
    ("trixie", "22.05", ROOTS / "bookworm"),
    ("trixie", "24.11", None),
    ("bookworm", "", None),
    (None, "22.05", ROOTS / "bookworm"),
])
def test_a_root_only_for_a_release_the_machine_does_not_package(
        machine: str | None, release: str, root: Path | None) -> None:
    assert releases.root_for(release, machine) == root


def test_the_machine_suite_comes_from_os_release_else_debian_version(tmp_path: Path) -> None:
    os_release, version = tmp_path / "os-release", tmp_path / "debian_version"
    os_release.write_text('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nVERSION_CODENAME=trixie\n')
    version.write_text("12.11\n")
    assert HOST_SUITE(os_release, version) == "trixie"
    os_release.unlink()
    assert HOST_SUITE(os_release, version) == "bookworm"
    version.write_text("11.9\n")
    assert HOST_SUITE(os_release, version) is None


# -- building it --------------------------------------------------------------------------

def test_the_build_commands(tmp_path: Path) -> None:
    steps = releases.build_steps("trixie", tmp_path / "r")
    assert [step.argv for step in steps] == [
        ["debootstrap", "--variant=minbase", "trixie", str(tmp_path / "r"),
         "http://deb.debian.org/debian"],
        ["chroot", str(tmp_path / "r"), "apt-get", "update"],
        ["chroot", str(tmp_path / "r"), "apt-get", "install", "-y", "--no-install-recommends",
         *releases.root_packages("trixie")],
    ]


def test_each_suite_gets_its_own_library_package_names() -> None:
    trixie, bookworm = releases.root_packages("trixie"), releases.root_packages("bookworm")
    for package in ("slurm-wlm", "slurmdbd", "slurm-client", "munge", "openssh-server",
                    "python3", "libffi8"):
        assert package in trixie and package in bookworm
    assert "libssl3t64" in trixie and "libssl3" not in trixie
    assert "libssl3" in bookworm and "libssl3t64" not in bookworm


class FakeApt:
    """Runs nothing; the install step creates the programs a complete root has."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if self.fail and self.fail in argv:
            return subprocess.CompletedProcess(argv, 100, "", "E: Unable to locate package\n")
        if argv[0] == "debootstrap":
            (Path(argv[3]) / "usr" / "sbin").mkdir(parents=True)
        if "install" in argv:
            for program in releases.ROOT_PROGRAMS:
                path = Path(argv[1]) / program
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("#!/bin/sh\n")
                path.chmod(0o755)
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_a_root_is_built_once_beside_its_place_and_then_reused(tmp_path: Path) -> None:
    root, apt = tmp_path / "roots" / "trixie", FakeApt()
    note = releases.ensure_root(root, "trixie", runner=apt)
    assert note.startswith(f"built {root} in ")
    building = str(root.with_name("trixie.building"))
    assert [call[0] for call in apt.calls] == ["sh", "debootstrap", "chroot", "chroot"]
    assert apt.calls[1][3] == building and apt.calls[2][1] == building
    assert releases.root_complete(root, "trixie") and not Path(building).exists()
    assert (root / "usr" / "sbin" / "policy-rc.d").read_text().endswith("exit 101\n")
    assert (root / "run" / "sshd").is_dir()
    marker = json.loads((root / releases.MARKER).read_text())
    assert marker == {"suite": "trixie", "packages": list(releases.root_packages("trixie"))}
    again = FakeApt()
    assert releases.ensure_root(root, "trixie", runner=again) == f"{root} present"
    assert again.calls == []


def test_a_root_without_marker_or_with_another_package_list_is_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "trixie"
    releases.ensure_root(root, "trixie", runner=FakeApt())
    marker = root / releases.MARKER
    marker.write_text(json.dumps({"suite": "trixie", "packages": ["slurm-wlm"]}))
    assert not releases.root_complete(root, "trixie")
    marker.unlink()
    assert not releases.root_complete(root, "trixie")
    assert releases.ensure_root(root, "trixie", runner=FakeApt()).startswith("built")
    assert [p.name.split("-")[0] for p in tmp_path.glob("trixie.replaced-*")] == [
        "trixie.replaced"], "the outdated root is set aside (a cluster may still use it)"
    (root / "usr" / "sbin" / "slurmd").unlink()
    assert not releases.root_complete(root, "trixie")


def test_a_failed_step_is_named_and_leaves_no_root(tmp_path: Path) -> None:
    root = tmp_path / "trixie"
    with pytest.raises(InstallError, match=r"apt-get install .*exited with 100:\nE: Unable"):
        releases.ensure_root(root, "trixie", runner=FakeApt(fail="install"))
    assert not root.exists()


def test_the_slurm_version_is_read_from_the_roots_dpkg_status(tmp_path: Path) -> None:
    status = tmp_path / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: slurm-client\nVersion: 1\n\nPackage: slurm-wlm\nStatus: install"
                      " ok installed\nVersion: 24.11.5-4+deb13u1\n\n")
    assert releases.slurm_version(tmp_path) == "24.11.5-4+deb13u1"
    assert releases.slurm_version(tmp_path / "none") == ""


# -- running in it ------------------------------------------------------------------------

def test_what_a_process_in_the_root_sees(tmp_path: Path) -> None:
    mounts = releases.root_mounts(Path("/tmp/dslurm-2411"), [
        "/work/main/.venv", "/root/.pyenv/versions/3.11.7", "/home/me/venv"])
    assert mounts == [
        "rw:/proc", "rw:/sys", "rw:/dev", "rw:/tmp", "rw:/home",
        "file:/etc/hosts", "file:/etc/passwd", "file:/etc/group", "file:/etc/shadow",
        "ro:/work/main/.venv", "ro:/root/.pyenv/versions/3.11.7",
    ]
    assert "rw:/srv/dslurm" in releases.root_mounts(Path("/srv/dslurm"))


def test_payload_paths_are_the_venvs_and_their_interpreters_prefix(tmp_path: Path) -> None:
    prefix, venv, ray = tmp_path / "pyenv" / "3.11.7", tmp_path / "venv", tmp_path / "ray"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3.11").write_text("")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(prefix / "bin" / "python3.11")
    environ = {"A": str(venv), "B": str(ray), "C": ""}
    assert releases.payload_paths(environ, ["A", "B", "C", "D"]) == (
        str(venv), str(prefix), str(ray))


def test_the_shim_mounts_each_path_at_its_place_then_chroots(tmp_path: Path) -> None:
    stubs, root, log = tmp_path / "stubs", tmp_path / "root", tmp_path / "log"
    stubs.mkdir()
    (root / "etc").mkdir(parents=True)
    for name in ("mount", "chroot"):
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {shlex.quote(str(log))}\n')
        stub.chmod(0o755)
    argv = releases.in_root(root, ["rw:/proc", "file:/etc/hosts", "ro:/opt/env x"],
                            ["/usr/sbin/slurmd", "-D", "a b"])
    env = {"PATH": f"{stubs}:/usr/bin:/bin"}
    assert subprocess.run(argv, env=env, check=False).returncode == 0
    assert log.read_text().splitlines() == [
        f"mount --rbind /proc {root}/proc",
        f"mount --bind /etc/hosts {root}/etc/hosts",
        f"mount --rbind /opt/env x {root}/opt/env x",
        f"mount -o remount,bind,ro {root}/opt/env x",
        f"chroot {root} /usr/sbin/slurmd -D a b",
    ]
    assert (root / "etc" / "hosts").exists() and (root / "opt" / "env x").is_dir()


def test_the_shim_stops_at_a_failed_mount(tmp_path: Path) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "mount").write_text("#!/bin/sh\nexit 32\n")
    (stubs / "mount").chmod(0o755)
    argv = releases.in_root(tmp_path / "root", ["rw:/proc"], ["/bin/true"])
    proc = subprocess.run(argv, env={"PATH": f"{stubs}:/usr/bin:/bin"}, check=False)
    assert proc.returncode == 1


def test_the_client_wrapper_quotes_every_value(tmp_path: Path) -> None:
    argv = releases.in_root_namespace(Path("/roots/it's"), ["rw:/tmp"], ["/usr/bin/squeue"])
    text = releases.client_script("squeue", "24.11", Path("/roots/it's"), argv)
    exec_line = next(line for line in text.splitlines() if line.startswith("exec "))
    assert shlex.split(exec_line) == ["exec", *argv, "$@"]
    assert text.startswith("#!/bin/sh\n") and "\nPATH=/usr/sbin:" in text


# -- settings, daemons, clients ------------------------------------------------------------

def test_the_release_is_chosen_then_remembered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = resolve_settings(state_dir=tmp_path, slurm_release="24.11")
    assert settings.slurm_release == "24.11" and settings.slurm_root == ROOTS / "trixie"
    record_settings(settings)
    assert resolve_settings(state_dir=tmp_path).slurm_root == ROOTS / "trixie"
    monkeypatch.setenv(releases.RELEASE_ENV, "native")
    assert resolve_settings(state_dir=tmp_path).slurm_root is None
    monkeypatch.delenv(releases.RELEASE_ENV)
    assert resolve_settings(state_dir=tmp_path, slurm_release="22.05").slurm_root is None
    with pytest.raises(DevClusterError, match="unknown Slurm release"):
        resolve_settings(state_dir=tmp_path, slurm_release="17.11")


def test_payload_paths_come_from_the_environment_else_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGSTER_SLURM_TEST_ENV_PATH", "/opt/payload-venv")
    record_settings(resolve_settings(state_dir=tmp_path, slurm_release="24.11"))
    monkeypatch.delenv("DAGSTER_SLURM_TEST_ENV_PATH")
    settings = resolve_settings(state_dir=tmp_path)
    assert settings.payload_paths == ("/opt/payload-venv",)
    assert "ro:/opt/payload-venv" in settings.root_mounts


def test_slurm_daemons_and_the_login_node_run_in_the_root(tmp_path: Path) -> None:
    settings = resolve_settings(state_dir=tmp_path / "s", slurm_release="24.11")
    specs = {spec.name: spec for spec in build_specs(settings, ClusterProbes(settings))}
    root = str(ROOTS / "trixie")
    for name in ("slurmdbd", "slurmctld"):
        argv = specs[name].argv
        assert Path(argv[0]).name == "unshare" and argv[1:4] == ("--mount", "--propagation",
                                                                  "private")
        assert argv[4:8] == ("/bin/sh", "-c", releases.ROOT_SHIM, "root-shim") and argv[8] == root
    for name in ("slurmd-c1", "sshd"):
        argv = specs[name].argv
        shim = argv.index(releases.ROOT_SHIM)
        assert argv[shim + 2] == root and argv[argv.index("--", shim) + 1].endswith(
            "/slurmd" if name == "slurmd-c1" else "/sshd")
    assert specs["munged"].argv[0].endswith("munged") and "root-shim" not in specs["mariadb"].argv
    native = resolve_settings(state_dir=tmp_path / "n")
    assert releases.ROOT_SHIM not in build_specs(native, ClusterProbes(native))[3].argv


def test_clients_on_this_machine_use_the_release_wrappers(tmp_path: Path) -> None:
    info = DevClusterInfo.from_settings(resolve_settings(state_dir=tmp_path, slurm_release="24.11"))
    assert info.env()[CLIENT_BIN_ENV] == str(tmp_path / "bin")
    assert info.slurm_command("squeue") == str(tmp_path / "bin" / "squeue")
    assert info.export_lines()[-1] == f'export PATH={tmp_path / "bin"}:"$PATH"'
    native = DevClusterInfo.from_settings(resolve_settings(state_dir=tmp_path / "n"))
    assert CLIENT_BIN_ENV not in native.env() and native.slurm_command("squeue") == "squeue"
    assert slurm_command({}, "sacct") == "sacct"
    assert os.path.basename(slurm_command({CLIENT_BIN_ENV: "/x/bin"}, "sacct")) == "sacct"
