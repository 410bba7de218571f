"""The master's command line, durations, status text and the login command's target (pure)."""

from __future__ import annotations

import argparse
import shlex

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.logins import master
from dagster_slurm.logins.commands import target_of
from dagster_slurm.transport.login_place import LoginPlace, LoginRecord
from dagster_slurm.transport.openssh import client_argv
from dagster_slurm.transport.ssh_target import SSHTarget


def _option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, part in enumerate(argv) if part == "-o" and
            argv[i + 1].startswith(name + "=")]


def test_the_master_persists_goes_to_the_background_and_never_carries_a_password(tmp_path):
    target = SSHTarget("login", 2223, "alice", key_path="/k", password="secret",
                       known_hosts_path="/kh")
    place = LoginPlace.of(target, tmp_path)
    argv = master.master_argv(target, place, 3600)
    assert argv[0] == "ssh" and argv[-1] == "login"
    assert _option(argv, "ControlMaster") == ["ControlMaster=yes"]
    assert _option(argv, "ControlPersist") == ["ControlPersist=3600s"]
    assert "-f" in argv and "-N" in argv and argv[argv.index("-S") + 1] == str(place.socket)
    assert argv[argv.index("-i") + 1] == "/k" and argv[argv.index("-p") + 1] == "2223"
    assert _option(argv, "UserKnownHostsFile") == ["UserKnownHostsFile=/kh"]
    assert "secret" not in " ".join(argv)


def test_a_jump_chain_becomes_nested_proxy_commands_with_percent_escaped(tmp_path):
    first = SSHTarget("gate", 22, "g", key_path="/keys/100%")
    second = SSHTarget("bastion", 2200, "b", jump=first)
    target = SSHTarget("login", 22, "alice", jump=second)
    argv = master.master_argv(target, LoginPlace.of(target, tmp_path), 60)
    (proxy,) = _option(argv, "ProxyCommand")
    outer = shlex.split(proxy.removeprefix("ProxyCommand=").replace("%%", "%"))
    assert outer[-3:] == ["-W", "login:22", "bastion"]
    (inner,) = _option(outer, "ProxyCommand")
    inner_argv = shlex.split(inner.removeprefix("ProxyCommand=").replace("%%", "%"))
    assert inner_argv[-3:] == ["-W", "bastion:2200", "gate"] and "/keys/100%" in inner_argv


def test_clients_never_log_in_themselves_nor_prompt(tmp_path):
    argv = client_argv(LoginPlace("h", 22, "u", tmp_path))
    assert {"ControlMaster=no", "BatchMode=yes", "ProxyCommand=false"} <= set(argv)
    assert argv[argv.index("-F") + 1] == "/dev/null" and "-T" in argv


@pytest.mark.parametrize(("text", "seconds"), [("12h", 43200), ("90m", 5400), ("30s", 30),
                                                ("1d", 86400), ("3600", 3600)])
def test_durations(text, seconds):
    assert master.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "0", "-1h", "h"])
def test_bad_durations_name_the_option(text):
    with pytest.raises(ConfigurationError, match=f"--persist={text!r}"):
        master.parse_duration(text)


def test_status_says_whether_up_as_whom_to_where_and_since_when(tmp_path):
    place = LoginPlace("login", 22, "alice", tmp_path)
    down = master.LoginStatus(place, None, None).render()
    assert "alice@login:22: not up" in down and "dagster-slurm login" in down
    record = LoginRecord("alice@login:22", "me", 1_700_000_000.0, 7200.0, ("ssh",))
    text = master.LoginStatus(place, 4321, record).render(now=1_700_000_000.0 + 125)
    assert "up (ssh master pid 4321)" in text and "logged in by me" in text
    assert "2023-11-14 22:13:20 UTC (2 min 5 s ago)" in text
    assert "2 h 0 min after the last command" in text and str(place.socket) in text


def _args(**given) -> argparse.Namespace:
    fields = dict(host=None, port=None, user=None, key=None, known_hosts=None, jump=None,
                  prefix="E_")
    return argparse.Namespace(**{**fields, **given})


def test_the_target_comes_from_the_environment_and_options_override_it():
    env = {"E_HOST": "login", "E_PORT": "2222", "E_USER": "alice", "E_KEY_PATH": "/k"}
    target = target_of(_args(), env)
    assert (target.host, target.port, target.user, target.key_path) == ("login", 2222, "alice", "/k")
    with_password = target_of(_args(), {"E_HOST": "login", "E_USER": "a", "E_PASSWORD": "pw"})
    assert with_password.password is None  # ssh asks for it on the terminal
    other = target_of(_args(port=2223, jump="bob@gate:2200"), env)
    assert other.port == 2223 and other.jump == SSHTarget("gate", 2200, "bob")


def test_without_environment_host_and_user_are_required():
    with pytest.raises(ConfigurationError, match="--host"):
        target_of(_args(), {})
    target = target_of(_args(host="h", user="u"), {})
    assert (target.host, target.port, target.user) == ("h", 22, "u")
    with pytest.raises(ConfigurationError, match="--jump"):
        target_of(_args(host="h", user="u", jump="gate:ssh"), {})


def test_shared_login_mode_from_the_environment_is_checked():
    from dagster_slurm.resources.ssh import SSHConnectionResource

    env = {"E_HOST": "h", "E_USER": "u", "E_SHARED_LOGIN": "required"}
    assert SSHConnectionResource.from_env("E_", env).shared_login == "required"
    with pytest.raises(ConfigurationError, match="E_SHARED_LOGIN='always'"):
        SSHConnectionResource.from_env("E_", {**env, "E_SHARED_LOGIN": "always"})
