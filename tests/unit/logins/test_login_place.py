"""Where a shared login lives and what is recorded about it (pure, on real directories)."""

from __future__ import annotations

import os
import stat

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.transport.login_place import (
    LOGIN_DIR_ENV,
    LoginPlace,
    LoginRecord,
    ensure_private_dir,
    login_command,
    login_dir,
)
from dagster_slurm.transport.ssh_target import SSHTarget


def test_login_dir_prefers_the_variable_then_the_runtime_dir(tmp_path):
    assert login_dir({LOGIN_DIR_ENV: str(tmp_path / "x")}) == tmp_path / "x"
    assert login_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "dagster-slurm-logins"
    missing = str(tmp_path / "nope")
    assert login_dir({"XDG_RUNTIME_DIR": missing}).name == "logins"


def test_each_host_port_and_user_has_its_own_socket(tmp_path):
    a = LoginPlace("login", 22, "alice", tmp_path)
    assert a.socket == LoginPlace("login", 22, "alice", tmp_path).socket
    others = {LoginPlace("login", 2222, "alice", tmp_path).socket,
              LoginPlace("login", 22, "bob", tmp_path).socket,
              LoginPlace("login2", 22, "alice", tmp_path).socket}
    assert a.socket not in others and len(others) == 3
    assert a.socket.suffix == ".sock" and a.record_path.suffix == ".json"


def test_the_directory_is_created_private_and_a_shared_one_is_refused(tmp_path):
    made = ensure_private_dir(tmp_path / "logins")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    with pytest.raises(ConfigurationError, match=rf"{LOGIN_DIR_ENV}=.*open.*chmod 700"):
        ensure_private_dir(open_dir)


def test_a_socket_path_too_long_for_unix_sockets_is_refused(tmp_path):
    place = LoginPlace("h", 22, "u", tmp_path / ("d" * 120))
    with pytest.raises(ConfigurationError, match="shorter directory"):
        place.check_socket_path()


def test_the_record_is_written_whole_and_private_and_read_back(tmp_path):
    record = LoginRecord("u@h:22", "me", 1700000000.0, 3600.0, ("ssh", "-M"))
    path = tmp_path / "r.json"
    record.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert LoginRecord.read(path) == record
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    path.write_text("{not json")
    assert LoginRecord.read(path) is None
    assert LoginRecord.read(tmp_path / "missing.json") is None


def test_the_login_command_names_the_target_quoted():
    jump = SSHTarget("bastion", 22, "bob")
    target = SSHTarget("login node", 2223, "alice", key_path="~/k", jump=jump)
    assert login_command(target) == ("dagster-slurm login --host 'login node' --port 2223 "
                                     "--user alice --key '~/k' --jump bob@bastion:22")
