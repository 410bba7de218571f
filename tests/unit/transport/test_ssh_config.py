"""Configuration of SSHConnectionResource (pure; the connection itself is tested on the dev cluster)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport.base import render_command


@pytest.mark.parametrize("prefix", ["EDGE", "EDGE_"])
def test_from_env_accepts_prefix_with_or_without_underscore(prefix):
    env = {"EDGE_HOST": "login", "EDGE_PORT": "2222", "EDGE_USER": "me", "EDGE_KEY_PATH": "/k"}
    res = SSHConnectionResource.from_env(prefix=prefix, environ=env)
    assert (res.host, res.port, res.user, res.key_path) == ("login", 2222, "me", "/k")


def test_from_env_reads_key_alias_known_hosts_and_jump_host():
    env = {
        "E_HOST": "inner",
        "E_USER": "me",
        "E_KEY": "/id",
        "E_KNOWN_HOSTS": "/kh",
        "E_JUMP_HOST": "bastion",
        "E_JUMP_PASSWORD": "pw",
    }
    res = SSHConnectionResource.from_env(prefix="E", environ=env)
    target = res.to_target()
    assert target.key_path == "/id" and target.known_hosts_path == "/kh"
    assert target.jump is not None and target.jump.host == "bastion"
    assert target.jump.user == "me" and target.jump.password == "pw"
    assert "pw" not in repr(target) and "pw" not in target.label


def test_from_env_names_the_missing_or_bad_variable():
    with pytest.raises(ConfigurationError, match="E_USER"):
        SSHConnectionResource.from_env(prefix="E", environ={"E_HOST": "h"})
    with pytest.raises(ConfigurationError, match="E_PORT='ssh'"):
        SSHConnectionResource.from_env(prefix="E", environ={"E_HOST": "h", "E_USER": "u", "E_PORT": "ssh"})
    with pytest.raises(ConfigurationError, match="HOST_KEY_CHECKING"):
        SSHConnectionResource.from_env(
            prefix="E", environ={"E_HOST": "h", "E_USER": "u", "E_HOST_KEY_CHECKING": "maybe"}
        )


def test_validation_errors_name_field_and_value():
    with pytest.raises(ValidationError, match="port=70000"):
        SSHConnectionResource(host="h", user="u", port=70000)
    with pytest.raises(ValidationError, match="max_channels=0"):
        SSHConnectionResource(host="h", user="u", max_channels=0)
    with pytest.raises(ValidationError, match="mutually exclusive"):
        SSHConnectionResource(host="h", user="u", key_path="/k", password="p")


def test_password_is_not_in_repr():
    res = SSHConnectionResource(host="h", user="u", password="hunter2")
    assert "hunter2" not in repr(res)


def test_render_command_quotes_every_element():
    assert render_command(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    assert render_command(["true"], {"A": "x y"}) == "env A='x y' true"
    with pytest.raises(ValueError):
        render_command(["true"], {"A;B": "x"})
