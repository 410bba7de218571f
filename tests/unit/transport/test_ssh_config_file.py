"""The OpenSSH client configuration file (``~/.ssh/config``) on the paramiko path: what is
read for a host, how it merges with the resource's fields, ProxyJump chains, the label.

Real configuration files are written to ``tmp_path``; no connection is made except to a
stand-in for the TCP connect that refuses (and records) every attempt."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import dagster as dg
import paramiko
import pytest

from dagster_slurm.errors import AuthenticationFailed, CertificateError, ConfigurationError
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport import certificates, ssh_config, ssh_login
from dagster_slurm.transport.ssh import SSHOptions, SSHTarget, SSHTransport
from dagster_slurm.transport.ssh_config import HostConfig, JumpHop, host_config, local_user

HOME = os.path.expanduser("~")


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "ssh_config"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _ssh(path: str | None, **fields: object) -> SSHConnectionResource:
    return SSHConnectionResource(ssh_config_path=path, **fields)  # type: ignore[arg-type]


DEVLOGIN = """\
    Host devlogin
        HostName 127.0.0.1
        User dslurm
        Port 2222
        IdentityFile ~/.ssh/dev_%r_%h
        IdentityFile ~/.ssh/second
        CertificateFile ~/.ssh/dev-cert.pub
        UserKnownHostsFile %d/.ssh/dev_known_hosts ~/.ssh/other_known_hosts
        ServerAliveInterval 45
"""


# -- what the file says for a host ---------------------------------------------------------


def test_an_alias_gives_every_key_that_is_read(tmp_path: Path) -> None:
    found = host_config(_config(tmp_path, DEVLOGIN), "devlogin")
    assert found == HostConfig(
        name="devlogin", hostname="127.0.0.1", user="dslurm", port=2222,
        identity_file=f"{HOME}/.ssh/dev_dslurm_127.0.0.1",
        certificate_file=f"{HOME}/.ssh/dev-cert.pub",
        known_hosts_file=f"{HOME}/.ssh/dev_known_hosts", server_alive_interval=45)


def test_the_resource_takes_the_alias_settings(tmp_path: Path) -> None:
    ssh = _ssh(_config(tmp_path, DEVLOGIN), host="devlogin")
    target = ssh.to_target()
    assert (target.host, target.port, target.user, target.alias) == (
        "127.0.0.1", 2222, "dslurm", "devlogin")
    assert target.key_path == f"{HOME}/.ssh/dev_dslurm_127.0.0.1"
    assert target.certificate_path == f"{HOME}/.ssh/dev-cert.pub"
    assert target.known_hosts_path == f"{HOME}/.ssh/dev_known_hosts"
    assert target.jump is None
    assert ssh.to_options().keepalive_interval == 45


def test_host_star_gives_defaults_after_the_specific_blocks(tmp_path: Path) -> None:
    path = _config(tmp_path, """\
        Host login
            User alice
        Host *.cluster.example
            Port 2200
        Host *
            User nobody
            Port 22
            ServerAliveInterval 10
    """)
    assert (host_config(path, "login").user, host_config(path, "login").port) == ("alice", 22)
    other = host_config(path, "n1.cluster.example")
    assert (other.user, other.port, other.server_alive_interval) == ("nobody", 2200, 10)
    assert other.hostname is None and other.proxy_jump is None


def test_fields_set_on_the_resource_win(tmp_path: Path) -> None:
    path = _config(tmp_path, DEVLOGIN + "    ProxyJump gw\n")
    ssh = _ssh(path, host="devlogin", port=2300, user="me", key_path="/k/id",
               known_hosts_path="/k/known_hosts", keepalive_interval=5,
               jump_host=_ssh(None, host="bastion", user="me"))
    target = ssh.to_target()
    assert (target.host, target.port, target.user, target.key_path, target.known_hosts_path) \
        == ("127.0.0.1", 2300, "me", "/k/id", "/k/known_hosts")
    assert target.certificate_path is None  # key_path keeps <key_path>-cert.pub
    assert target.jump == SSHTarget("bastion", 22, "me")
    assert ssh.to_options().keepalive_interval == 5


def test_a_password_is_not_mixed_with_the_file_identity(tmp_path: Path) -> None:
    target = _ssh(_config(tmp_path, DEVLOGIN), host="devlogin", password="pw").to_target()
    assert (target.key_path, target.certificate_path, target.password) == (None, None, "pw")


def test_without_a_user_anywhere_the_local_user_logs_in(tmp_path: Path) -> None:
    target = _ssh(_config(tmp_path, "Host other\n  User x\n"), host="login").to_target()
    assert target.user == local_user() and target.port == 22 and target.alias is None


def test_explicit_values_survive_model_copy_and_dagster(tmp_path: Path) -> None:
    path = _config(tmp_path, DEVLOGIN)
    copied = _ssh(path, host="devlogin").model_copy(update={"port": 2300})
    assert copied.to_target().port == 2300
    seen: dict[str, int] = {}

    @dg.asset
    def probe(explicit: SSHConnectionResource, unset: SSHConnectionResource) -> None:
        seen["explicit"] = explicit.to_target().port
        seen["unset"] = unset.to_target().port

    # Dagster rebuilds a resource from the values that differ from the field's default:
    # port=22 given on the resource must still win over the file's Port 2222.
    dg.materialize([probe], resources={"explicit": _ssh(path, host="devlogin", port=22),
                                       "unset": _ssh(path, host="devlogin")})
    assert seen == {"explicit": 22, "unset": 2222}


# -- ProxyJump -----------------------------------------------------------------------------

CHAIN = """\
    Host login
        HostName 10.0.0.5
        User alice
        IdentityFile /keys/alice
        ProxyJump jumper@gw1:2201,gw2
    Host gw1
        HostName gw1.example
        User ignored
        Port 9999
    Host gw2
        HostName 192.0.2.2
        User bob
        IdentityFile /keys/bob
        UserKnownHostsFile /keys/gw2_known_hosts
        ProxyJump ignored-as-not-first
    Host ignored-as-not-first
        HostName 192.0.2.99
"""


def test_a_chain_of_two_hops_each_looked_up(tmp_path: Path) -> None:
    target = _ssh(_config(tmp_path, CHAIN), host="login", known_hosts_path="/kh",
                  host_key_checking="accept-new").to_target()
    first = SSHTarget("gw1.example", 2201, "jumper", key_path="/keys/alice",
                      known_hosts_path="/kh", host_key_checking="accept-new", alias="gw1")
    assert target.jump == SSHTarget("192.0.2.2", 22, "bob", key_path="/keys/bob",
                                    known_hosts_path="/keys/gw2_known_hosts",
                                    host_key_checking="accept-new", jump=first, alias="gw2")
    assert target.label == ("alice@10.0.0.5:22 (Host login) via bob@192.0.2.2:22 (Host gw2) "
                            "via jumper@gw1.example:2201 (Host gw1)")


def test_the_first_hop_goes_through_its_own_proxyjump(tmp_path: Path) -> None:
    path = _config(tmp_path, """\
        Host login
            ProxyJump gw
        Host gw
            ProxyJump outer:2022
    """)
    target = _ssh(path, host="login", user="alice").to_target()
    assert target.jump is not None and target.jump.jump is not None
    assert (target.jump.host, target.jump.jump.host, target.jump.jump.port) == (
        "gw", "outer", 2022)
    assert target.jump.jump.jump is None


def test_proxyjump_none_and_a_host_star_loop(tmp_path: Path) -> None:
    path = _config(tmp_path, """\
        Host gw
            ProxyJump none
        Host *
            ProxyJump gw
    """)
    assert host_config(path, "gw").proxy_jump == ()
    target = _ssh(path, host="login", user="a").to_target()
    assert target.jump is not None and target.jump.host == "gw" and target.jump.jump is None
    assert _ssh(path, host="gw", user="a").to_target().jump is None
    looping = _config(tmp_path, "Host *\n  ProxyJump gw\n")
    with pytest.raises(ConfigurationError, match="loops back to 'gw'.*'ProxyJump none'"):
        _ssh(looping, host="login", user="a").to_target()


def test_hop_specs_are_parsed() -> None:
    assert ssh_config.parse_jump("f", "h", "ssh://u@[::1]:2022, plain ,u2@h2:22") == (
        JumpHop("::1", "u", 2022), JumpHop("plain"), JumpHop("h2", "u2", 22))
    with pytest.raises(ConfigurationError, match="ProxyJump port"):
        ssh_config.parse_jump("f", "h", "gw:ssh")


def test_a_chain_is_connected_from_the_first_hop(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    reached: list[str] = []

    def refuse(target: SSHTarget, timeout: float) -> object:
        reached.append(target.address)
        raise AuthenticationFailed(f"SSH login to {ssh_login.tried(target)} refused")

    monkeypatch.setattr(ssh_login, "open_tcp", refuse)
    monkeypatch.setattr(ssh_login.paramiko.PKey, "from_path", lambda path: None)
    target = _ssh(_config(tmp_path, CHAIN), host="login", host_key_checking="off").to_target()
    transport = SSHTransport(target, SSHOptions(connect_timeout=1, reconnect_attempts=1))
    with pytest.raises(AuthenticationFailed) as caught:
        transport.run(["true"], timeout=5)
    assert reached == ["jumper@gw1.example:2201 (Host gw1)"]
    assert str(caught.value) == (
        "cannot reach alice@10.0.0.5:22 (Host login) through its jump host: cannot reach "
        "bob@192.0.2.2:22 (Host gw2) through its jump host: SSH login to "
        "jumper@gw1.example:2201 (Host gw1, key /keys/alice) refused")


# -- the file itself -----------------------------------------------------------------------


def test_a_missing_file_or_none_gives_no_settings(tmp_path: Path) -> None:
    plain = SSHTarget("devlogin", 22, "u")
    assert _ssh(str(tmp_path / "absent"), host="devlogin", user="u").to_target() == plain
    assert _ssh(None, host="devlogin", user="u").to_target() == plain
    path = _config(tmp_path, DEVLOGIN)
    assert _ssh(None, host="devlogin", user="u").to_target() == plain
    assert _ssh(path, host="devlogin", user="u").to_target() != plain


@pytest.mark.parametrize("text, problem", [
    ("Host a\n  this-line has = no key\n", "cannot be parsed"),
    ("Host a\n  Port ssh\n", "Port 'ssh' of host 'a'"),
    ('Host "a\n  User b\n', "cannot be parsed"),
])
def test_a_file_that_cannot_be_used_is_an_error_naming_it(tmp_path: Path, text: str,
                                                          problem: str) -> None:
    path = _config(tmp_path, text)
    with pytest.raises(ConfigurationError) as caught:
        _ssh(path, host="a", user="u").to_target()
    assert caught.value.field == "ssh_config_path"
    assert path in str(caught.value) and problem in str(caught.value)


def test_the_file_is_parsed_once_per_version(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    parsed: list[str] = []
    original = paramiko.SSHConfig.from_text
    monkeypatch.setattr(paramiko.SSHConfig, "from_text",
                        lambda text: parsed.append(text) or original(text))
    path = _config(tmp_path, "Include ~/.ssh/config.d/*\nHost a\n  Port 2001\n")
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.ssh"):
        assert host_config(path, "a").port == 2001
        assert host_config(path, "a").port == 2001
    assert len(parsed) == 1 and caplog.text.count("Include lines") == 1
    Path(path).write_text("Host a\n  Port 2002\n")
    os.utime(path, ns=(1, 1))
    assert host_config(path, "a").port == 2002 and len(parsed) == 2


# -- from_env, labels, messages ------------------------------------------------------------


def test_from_env_resolves_its_host_in_the_file(tmp_path: Path) -> None:
    env = {"E_HOST": "devlogin", "E_USER": "me"}
    ssh = SSHConnectionResource.from_env(prefix="E", environ=env)
    assert ssh.port is None and ssh.ssh_config_path == "~/.ssh/config"
    resolved = ssh.model_copy(update={"ssh_config_path": _config(tmp_path, DEVLOGIN)})
    target = resolved.to_target()
    assert (target.host, target.port, target.user) == ("127.0.0.1", 2222, "me")
    env["E_PORT"] = "2300"
    explicit = SSHConnectionResource.from_env(prefix="E", environ=env)
    assert explicit.model_copy(update={"ssh_config_path": None}).to_target().port == 2300


def test_label_and_login_errors_show_the_resolved_target(tmp_path: Path) -> None:
    target = _ssh(_config(tmp_path, DEVLOGIN + "    ProxyJump gw\n"),
                  host="devlogin").to_target()
    user = local_user()
    assert target.label == f"dslurm@127.0.0.1:2222 (Host devlogin) via {user}@gw:22"
    key = f"{HOME}/.ssh/dev_dslurm_127.0.0.1"
    assert ssh_login.tried(target) == (
        f"dslurm@127.0.0.1:2222 (Host devlogin, key {key} with certificate "
        f"{HOME}/.ssh/dev-cert.pub, through jump host {user}@gw:22)")


# -- CertificateFile -----------------------------------------------------------------------


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A user key, an expired certificate of it under a name of its own (``site.cert``),
    and one valid forever next to it (``user-cert.pub``)."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    ca, user = tmp_path / "ca", tmp_path / "user"
    for path in (ca, user):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                       check=True)
    next_to_key, named = tmp_path / "user-cert.pub", tmp_path / "site.cert"

    def sign(validity: str) -> None:
        subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "id", "-n", "alice", "-V",
                        validity, f"{user}.pub"], check=True)

    sign("-2h:-1h")
    next_to_key.rename(named)
    sign("always:forever")
    return user, named, next_to_key


def test_certificate_path_replaces_the_cert_pub_next_to_the_key(
        signed: tuple[Path, Path, Path]) -> None:
    user, named, next_to_key = signed
    plain = SSHTarget("h", 22, "alice", key_path=str(user))
    assert certificates.certificate_file(plain) == str(next_to_key)
    certificates.prepare_certificate(plain)  # the forever-valid one next to the key
    key = ssh_login.load_key(plain)
    assert key is not None and key.public_blob is not None
    target = SSHTarget("h", 22, "alice", key_path=str(user), certificate_path=str(named))
    assert certificates.certificate_file(target) == str(named)
    with pytest.raises(CertificateError, match=f"the certificate {named} expired"):
        certificates.prepare_certificate(target)
    key = ssh_login.load_key(target)
    assert key is not None and key.public_blob is not None
    assert key.public_blob == paramiko.PublicBlob.from_file(str(named))
    missing = SSHTarget("h", 22, "alice", key_path=str(user),
                        certificate_path=str(named) + ".absent")
    key = ssh_login.load_key(missing)
    assert key is not None and key.public_blob is None
    Path(named).write_text(Path(f"{user}.pub").read_text().replace("ed25519", "rsa", 1))
    with pytest.raises(CertificateError, match="cannot be used with the key"):
        ssh_login.load_key(target)
