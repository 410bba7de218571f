"""Commands through a real OpenSSH master, spoken to in its own protocol (no ssh process)."""

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from dagster_slurm.errors import CommandTimeout, LoginRequired
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport import mux_client
from dagster_slurm.transport.login_place import LoginPlace
from dagster_slurm.transport.openssh import OpenSSHTransport, master_pid
from dagster_slurm.transport.ssh_target import SSHOptions

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "dagster_slurm.cli"]


@pytest.fixture
def shared(slurm_cluster):
    with tempfile.TemporaryDirectory(prefix="mx-", dir="/tmp") as directory:
        os.chmod(directory, 0o700)
        env = {**os.environ, **slurm_cluster.env(), "DAGSTER_SLURM_LOGIN_DIR": directory}
        done = subprocess.run([*CLI, "login"], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        target = SSHConnectionResource.from_env(environ=env).to_target()
        place = LoginPlace.of(target, Path(directory))
        try:
            yield OpenSSHTransport(target, SSHOptions(max_channels=20), place=place)
        finally:
            subprocess.run([*CLI, "logout"], env=env, capture_output=True, timeout=60)


def test_status_input_and_output_of_any_size(shared):
    result = shared.run(["bash", "-c", "cat; echo err >&2; exit 7"], stdin=b"in" * 2_000_000)
    assert (result.exit_code, len(result.stdout), result.stderr) == (7, 4_000_000, "err\n")
    big = shared.run(["head", "-c", "3000000", "/dev/zero"])
    assert big.exit_code == 0 and len(big.stdout) == 3_000_000
    assert shared.run(["bash", "-c", "exit 255"]).exit_code == 255  # the command's own


def test_the_master_answers_the_alive_check(shared):
    pid = master_pid(shared.place)
    assert pid and pid == mux_client.alive_pid(str(shared.place.socket))
    os.kill(pid, 0)


def test_a_command_over_its_time_is_a_timeout(shared):
    with pytest.raises(CommandTimeout):
        shared.run(["sleep", "30"], timeout=1)
    assert shared.run(["true"]).ok


def test_a_master_killed_mid_command_is_login_required(shared):
    pid = master_pid(shared.place)
    killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(LoginRequired, match="may or may not have completed"):
        shared.run(["sleep", "20"])
    with pytest.raises(LoginRequired, match="dagster-slurm login"):
        shared.run(["true"])


def test_sessions_beyond_maxsessions_wait_for_a_free_one(shared, caplog):
    streams = [shared.open_stream(["sleep", "3"]) for _ in range(10)]  # sshd allows 10
    try:
        with caplog.at_level(logging.INFO, "dagster_slurm.ssh"):
            result = shared.run(["echo", "through"])
        assert result.stdout == "through\n"
        assert any("refuses more sessions" in m for m in caplog.messages), (
            "no session was refused: the test proves nothing")
    finally:
        for stream in streams:
            stream.close()
