"""``status`` and ``down`` know the login sites' daemons: stand-in processes named like
the sites' sshds, with pid files in a state directory of ``tmp_path``, take their place
(no real daemon is touched; root is pretended)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_slurm.devcluster import DevCluster
from dagster_slurm.devcluster.otp import PAM_SERVICE


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DevCluster:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for name in ("DAGSTER_SLURM_DEV_LOGIN_SITES", "DAGSTER_SLURM_DEV_SSH_PORT"):
        monkeypatch.delenv(name, raising=False)
    cluster = DevCluster(state_dir=tmp_path / "state", login_sites=("otp", "bastion"))
    cluster.paths.run.mkdir(parents=True)
    return cluster


@pytest.fixture
def stand_ins(cluster: DevCluster, tmp_path: Path) -> Iterator[dict[str, subprocess.Popen]]:
    """``sleep`` copied to ``sshd`` and to the otp site's program name, one per site."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    programs = {"sshd-otp": PAM_SERVICE, "sshd-cert": "sshd", "sshd-bastion": "sshd"}
    started = {}
    for daemon, program in programs.items():
        copy = tmp_path / "bin" / daemon / program
        copy.parent.mkdir(parents=True)
        shutil.copy(sleep, copy)
        started[daemon] = subprocess.Popen([str(copy), "60"])
        cluster.paths.pid_file(daemon).write_text(f"{started[daemon].pid}\n")
    yield started
    for proc in started.values():
        proc.kill()
        proc.wait()


def _gone(proc: subprocess.Popen) -> bool:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_status_lists_chosen_sites_and_sites_still_running(
    cluster: DevCluster, stand_ins: dict[str, subprocess.Popen]
) -> None:
    daemons = {d.name: d for d in cluster.status().daemons}
    assert daemons["sshd-otp"].alive and daemons["sshd-otp"].pid == stand_ins["sshd-otp"].pid
    assert daemons["sshd-bastion"].alive
    assert daemons["sshd-cert"].alive, "a site that runs is shown even when not chosen"
    stand_ins["sshd-cert"].kill()
    assert _gone(stand_ins["sshd-cert"])
    assert "sshd-cert" not in {d.name for d in cluster.status().daemons}


def test_down_stops_the_sites(cluster: DevCluster, stand_ins: dict[str, subprocess.Popen]) -> None:
    stopped = cluster.down()
    assert stopped == ["sshd-bastion", "sshd-cert", "sshd-otp"], "sites stop first"
    assert all(_gone(proc) for proc in stand_ins.values())
