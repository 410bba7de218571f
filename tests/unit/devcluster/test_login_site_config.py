"""The login sites' settings, configuration files, daemons and exported variables (pure:
nothing is started, nothing is written outside ``tmp_path``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagster_slurm.devcluster import sites
from dagster_slurm.devcluster.errors import DevClusterError
from dagster_slurm.devcluster.info import DevClusterInfo
from dagster_slurm.devcluster.layout import (
    LOGIN_SITES,
    LOGIN_SITES_ENV,
    Settings,
    parse_login_sites,
    record_settings,
    resolve_settings,
)
from dagster_slurm.devcluster.otp import PAM_DIR, PAM_SERVICE
from dagster_slurm.devcluster.sshd import accepts_option


def _config(text: str) -> dict[str, list[str]]:
    """sshd_config keywords (without comments) -> their values, in order."""
    options: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            options.setdefault(key, []).append(value)
    return options


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path, login_sites=LOGIN_SITES)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all", ("otp", "cert", "bastion")),
        ("bastion,otp", ("otp", "bastion")),
        (" cert , cert ", ("cert",)),
        ("none", ()),
        ("", ()),
        (["bastion", "cert"], ("cert", "bastion")),
    ],
)
def test_site_lists_are_parsed_in_start_order(text: str, expected: tuple[str, ...]) -> None:
    assert parse_login_sites(text) == expected


def test_unknown_site_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'mfa'.*otp, cert, bastion, all or none"):
        parse_login_sites("otp,mfa")


def test_sites_come_from_argument_then_environment_then_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LOGIN_SITES_ENV, raising=False)
    assert resolve_settings(tmp_path).login_sites == ()
    record_settings(Settings(state_dir=tmp_path, login_sites=("otp", "cert")))
    assert json.loads((tmp_path / "settings.json").read_text())["login_sites"] == ["otp", "cert"]
    assert resolve_settings(tmp_path).login_sites == ("otp", "cert")
    monkeypatch.setenv(LOGIN_SITES_ENV, "bastion")
    assert resolve_settings(tmp_path).login_sites == ("bastion",)
    assert resolve_settings(tmp_path, login_sites=()).login_sites == ()
    monkeypatch.setenv(LOGIN_SITES_ENV, "sms")
    with pytest.raises(DevClusterError, match=LOGIN_SITES_ENV):
        resolve_settings(tmp_path)


def test_sites_listen_next_to_the_login_node(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, ssh_port=3000)
    assert [settings.site_port(s) for s in LOGIN_SITES] == [3001, 3002, 3003]


@pytest.mark.parametrize("option", [True, False])
def test_otp_site_asks_for_key_and_code_through_its_own_pam_service(
    settings: Settings, option: bool
) -> None:
    text = sites.render_site_config(settings, "otp", sites.SitePlan(pam_service_option=option))
    config = _config(text)
    assert config["Port"] == ["2223"]
    assert config["AuthenticationMethods"] == ["publickey,keyboard-interactive"]
    assert config["UsePAM"] == ["yes"] and config["KbdInteractiveAuthentication"] == ["yes"]
    assert config["PasswordAuthentication"] == ["no"]
    assert config["LogLevel"] == ["VERBOSE"]
    assert config["PidFile"] == [str(settings.paths.pid_file("sshd-otp"))]
    assert config.get("PAMServiceName") == ([PAM_SERVICE] if option else None)


def test_otp_daemon_runs_as_its_pam_service_when_sshd_cannot_be_told(
    settings: Settings,
) -> None:
    linked = sites.site_spec(settings, "otp", sites.SitePlan(pam_service_option=False))
    program = settings.paths.programs / PAM_SERVICE
    assert str(program) in linked.argv and linked.comm == PAM_SERVICE[:15]
    assert linked.comm in sites.SITE_COMMS["sshd-otp"]
    told = sites.site_spec(settings, "otp", sites.SitePlan(pam_service_option=True))
    assert str(program) not in told.argv and told.comm == "sshd"


def test_pam_service_checks_the_code_of_this_state_dir(settings: Settings) -> None:
    text = sites.render_pam_service(settings)
    auth = [line.split() for line in text.splitlines() if line.startswith("auth")]
    assert auth == [["auth", "requisite", "pam_oath.so",
                     f"usersfile={settings.paths.otp_users}", "window=1", "digits=6"]]
    files = {f.path: f for f in sites.render_site_files(settings, sites.SitePlan())}
    assert files[PAM_DIR / PAM_SERVICE].text == text
    assert PAM_DIR / "sshd" not in files


def test_cert_site_trusts_only_the_user_ca(settings: Settings) -> None:
    config = _config(sites.render_site_config(settings, "cert", sites.SitePlan()))
    assert config["Port"] == ["2224"]
    assert config["TrustedUserCAKeys"] == [f"{settings.paths.user_ca_key}.pub"]
    assert config["AuthorizedKeysFile"] == ["none"]
    assert config["AuthorizedPrincipalsFile"] == ["none"]
    assert config["AllowUsers"] == [settings.user]
    spec = sites.site_spec(settings, "cert", sites.SitePlan())
    assert Path(f"{settings.paths.user_ca_key}.pub") in spec.config_files


def test_bastion_forwards_only_to_the_login_node(settings: Settings) -> None:
    config = _config(sites.render_site_config(settings, "bastion", sites.SitePlan()))
    assert config["Port"] == ["2225"]
    assert config["AllowTcpForwarding"] == ["yes"]
    assert config["PermitOpen"] == ["127.0.0.1:2222 127.0.0.1:2223 127.0.0.1:2224"]


def test_each_site_is_a_daemon_of_its_own_on_its_node(settings: Settings) -> None:
    specs = sites.site_specs(settings, sites.SitePlan())
    assert [s.name for s in specs] == ["sshd-otp", "sshd-cert", "sshd-bastion"]
    for spec, port, node in zip(specs, (2223, 2224, 2225), ("login", "login", "bastion"), strict=True):
        assert spec.ports == (("127.0.0.1", port),)
        assert spec.logs[0] == settings.paths.log_file(spec.name)
        assert spec.argv[spec.argv.index("node-shim") + 1] == node
        assert spec.argv[-2:] == ("-E", str(settings.paths.log_file(spec.name)))
    only_cert = Settings(state_dir=settings.state_dir, login_sites=("cert",))
    assert [s.name for s in sites.site_specs(only_cert, sites.SitePlan())] == ["sshd-cert"]


def test_env_exports_ports_logs_and_cert_key_of_chosen_sites(settings: Settings) -> None:
    env = DevClusterInfo.from_settings(settings).env()
    log = settings.paths.log
    assert {k: v for k, v in env.items() if k.startswith("DAGSTER_SLURM_DEV_")} == {
        "DAGSTER_SLURM_DEV_OTP_PORT": "2223",
        "DAGSTER_SLURM_DEV_OTP_LOG": str(log / "sshd-otp.log"),
        "DAGSTER_SLURM_DEV_CERT_PORT": "2224",
        "DAGSTER_SLURM_DEV_CERT_LOG": str(log / "sshd-cert.log"),
        "DAGSTER_SLURM_DEV_BASTION_PORT": "2225",
        "DAGSTER_SLURM_DEV_BASTION_LOG": str(log / "sshd-bastion.log"),
        "DAGSTER_SLURM_DEV_CERT_KEY_PATH": str(settings.paths.cert_client_key),
    }
    plain = DevClusterInfo.from_settings(Settings(state_dir=settings.state_dir)).env()
    assert not [k for k in plain if k.startswith("DAGSTER_SLURM_DEV_")]


def test_site_lookup_says_how_to_start_a_missing_site(tmp_path: Path) -> None:
    info = DevClusterInfo.from_settings(Settings(state_dir=tmp_path, login_sites=("otp",)))
    assert info.site("otp").port == 2223
    with pytest.raises(KeyError, match="--login-sites bastion"):
        info.site("bastion")


def test_known_hosts_covers_every_chosen_site(settings: Settings) -> None:
    from dagster_slurm.devcluster.sshd import ensure_keys

    ensure_keys(Settings(state_dir=settings.state_dir, login_sites=("otp", "bastion")))
    lines = settings.paths.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in lines] == [
        "[127.0.0.1]:2222", "[127.0.0.1]:2223", "[127.0.0.1]:2225",
    ]
    assert len({tuple(line.split()[1:]) for line in lines}) == 1, "one host key for all"


@pytest.mark.parametrize("option", [True, False])
def test_per_source_penalties_are_off_where_sshd_has_them(
    settings: Settings, option: bool
) -> None:
    plan = sites.SitePlan(penalties_option=option)
    for name in LOGIN_SITES:
        config = _config(sites.render_site_config(settings, name, plan))
        assert config.get("PerSourcePenalties") == (["no"] if option else None)


def _fake_sshd(tmp_path: Path, knows: str, other_error: str = "") -> str:
    """A stand-in for ``sshd -t -f FILE`` that knows only the keyword ``knows`` of the
    probed ones, rejecting others as OpenSSH does with an unknown keyword."""
    script = tmp_path / "sshd"
    if other_error:
        body = f'echo "{other_error}" >&2; exit 255'
    else:
        body = (
            f'word=$(tail -n 1 "$3" | cut -d" " -f1); [ "$word" = {knows} ] && exit 0; '
            'echo "$3: line 3: Bad configuration option: $word" >&2; exit 255'
        )
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_probe_tells_which_options_sshd_accepts(tmp_path: Path) -> None:
    sshd = _fake_sshd(tmp_path, knows="PerSourcePenalties")
    assert accepts_option(sshd, tmp_path / "key", sites.NO_PENALTIES)
    assert not accepts_option(sshd, tmp_path / "key", f"PAMServiceName {PAM_SERVICE}")


def test_other_probe_failures_are_errors(tmp_path: Path) -> None:
    sshd = _fake_sshd(tmp_path, "", other_error="Missing privilege separation directory")
    with pytest.raises(DevClusterError, match="privilege separation"):
        accepts_option(sshd, tmp_path / "key", sites.NO_PENALTIES)
