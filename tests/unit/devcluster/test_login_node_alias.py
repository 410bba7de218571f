"""Several login nodes behind one name: the count is a remembered setting (1 changes nothing),
each node has its own address, port, sshd configuration and hosts line, the SSH port
becomes a round-robin alias, and ``env`` tells how to reach each node itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dagster_slurm.devcluster import alias, logins
from dagster_slurm.devcluster.config import render_all
from dagster_slurm.devcluster.errors import DevClusterError
from dagster_slurm.devcluster.info import DevClusterInfo
from dagster_slurm.devcluster.layout import LOGIN_NODES_ENV, record_settings, resolve_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (LOGIN_NODES_ENV, "DAGSTER_SLURM_DEV_SSH_PORT", "DAGSTER_SLURM_DEV_PORT_OFFSET",
                 "DAGSTER_SLURM_DEV_SSH_LISTEN"):
        monkeypatch.delenv(name, raising=False)


def test_one_login_node_by_default_changes_nothing(tmp_path: Path) -> None:
    settings = resolve_settings(state_dir=tmp_path)
    two = resolve_settings(state_dir=tmp_path / "b", login_nodes=2)
    assert settings.login_nodes == 1
    assert logins.login_nodes(settings) == () and logins.specs(settings) == []
    assert logins.chosen_daemons(settings) == ["sshd"]
    assert DevClusterInfo.from_settings(settings).login_nodes == ()
    one_files = {f.path.name: f.text for f in render_all(settings, "pw")}
    assert "login1" not in one_files["hosts"]
    two_hosts = render_all(two, "pw", logins.host_lines(two))[3].text
    assert "127.0.1.101 login1" in two_hosts and "127.0.1.102 login2" in two_hosts


def test_the_count_comes_from_the_option_the_environment_or_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_settings(resolve_settings(state_dir=tmp_path, login_nodes=2))
    assert resolve_settings(state_dir=tmp_path).login_nodes == 2
    monkeypatch.setenv(LOGIN_NODES_ENV, "3")
    assert resolve_settings(state_dir=tmp_path).login_nodes == 3
    assert resolve_settings(state_dir=tmp_path, login_nodes=1).login_nodes == 1


@pytest.mark.parametrize("text", ["two", "0", "9"])
def test_bad_counts_are_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(LOGIN_NODES_ENV, text)
    with pytest.raises(DevClusterError, match=LOGIN_NODES_ENV):
        resolve_settings(state_dir=tmp_path)


def test_each_login_node_has_its_own_address_port_and_sshd(tmp_path: Path) -> None:
    settings = resolve_settings(state_dir=tmp_path, login_nodes=2, port_offset=3000)
    nodes = logins.login_nodes(settings)
    assert [(n.name, n.address, n.port) for n in nodes] == [
        ("login1", "127.0.1.101", 5233), ("login2", "127.0.1.102", 5234)]
    assert logins.chosen_daemons(settings) == ["sshd-login1", "sshd-login2", "login-alias"]
    configs = {f.path.name: f.text for f in logins.render_files(settings)}
    assert "ListenAddress 127.0.1.101" in configs["sshd_config.login1"]
    assert "Port 5234" in configs["sshd_config.login2"]
    assert "PidFile none" in configs["sshd_config.login2"]
    specs = {spec.name: spec for spec in logins.specs(settings)}
    node_argv = specs["sshd-login1"].argv
    assert "--pid" in node_argv and "-D" in node_argv and "login1" in node_argv
    assert specs["login-alias"].ports == (("127.0.0.1", 5222),)
    assert "--to=127.0.1.101:5233" in specs["login-alias"].argv
    assert "--to=127.0.1.102:5234" in specs["login-alias"].argv


def test_env_aims_at_one_login_node(tmp_path: Path) -> None:
    info = DevClusterInfo.from_settings(resolve_settings(state_dir=tmp_path, login_nodes=2))
    env = info.env()
    assert env["SLURM_EDGE_NODE_PORT"] == str(info.port)
    assert env["DAGSTER_SLURM_DEV_LOGIN2_HOST"] == "127.0.1.102"
    assert env["DAGSTER_SLURM_DEV_LOGIN2_PORT"] == str(info.port + 12)
    aimed = info.env_at("login1")
    assert (aimed["SLURM_EDGE_NODE_HOST"], aimed["SLURM_EDGE_NODE_PORT"]) == (
        "127.0.1.101", str(info.port + 11))
    with pytest.raises(KeyError, match="login3"):
        info.login_node("login3")


def test_each_connection_tries_its_own_target_first() -> None:
    targets = [("a", 1), ("b", 2)]
    assert [alias.next_targets(turn, targets)[0] for turn in range(4)] == [
        ("a", 1), ("b", 2), ("a", 1), ("b", 2)]
    assert alias.next_targets(1, targets) == [("b", 2), ("a", 1)]
    assert alias.parse_address("127.0.1.101:22") == ("127.0.1.101", 22)
    with pytest.raises(ValueError):
        alias.parse_address("nohost")


def test_the_alias_forwards_in_turn_and_skips_a_refusing_target() -> None:
    async def scenario() -> list[bytes]:
        async def named(name: bytes):  # noqa: ANN202
            async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                writer.write(name + await reader.read(10))
                await writer.drain()
                writer.close()
            return await asyncio.start_server(answer, "127.0.0.1", 0)

        one, two = await named(b"one:"), await named(b"two:")
        refused = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead = refused.sockets[0].getsockname()[:2]
        refused.close()
        await refused.wait_closed()
        targets = [one.sockets[0].getsockname()[:2], dead, two.sockets[0].getsockname()[:2]]
        lines: list[str] = []
        front = await asyncio.start_server(alias.Alias(targets, lines.append).handle,
                                           "127.0.0.1", 0)
        port = front.sockets[0].getsockname()[1]
        answers = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"hi")
            writer.write_eof()
            answers.append(await asyncio.wait_for(reader.read(), 5))
            writer.close()
        for server in (front, one, two):
            server.close()
        return answers

    assert asyncio.run(scenario()) == [b"one:hi", b"two:hi", b"two:hi"]
