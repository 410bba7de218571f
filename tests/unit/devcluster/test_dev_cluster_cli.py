"""``dagster-slurm dev-cluster`` argument parsing for the login sites, and issuing
certificates with the real ``ssh-keygen`` in ``tmp_path``."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dagster_slurm.cli import build_parser
from dagster_slurm.devcluster import certs
from dagster_slurm.devcluster.errors import DevClusterError, NotRootError
from dagster_slurm.devcluster.layout import Settings

UTC = timezone.utc


def _parse(*argv: str):
    return build_parser().parse_args(["dev-cluster", *argv])


def test_up_takes_a_list_of_login_sites() -> None:
    assert _parse("up", "--login-sites", "all").login_sites == ("otp", "cert", "bastion")
    assert _parse("up", "--login-sites", "bastion,otp").login_sites == ("otp", "bastion")
    assert _parse("up", "--login-sites", "none").login_sites == ()
    assert _parse("up").login_sites is None, "without the option: what the last up ran"


def test_unknown_login_site_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse("up", "--login-sites", "otp,sms")
    assert exited.value.code == 2
    assert "unknown login site 'sms'" in capsys.readouterr().err


def test_up_help_documents_the_sites(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("up", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    for word in ("--login-sites", "otp", "cert", "bastion", "DAGSTER_SLURM_DEV_LOGIN_SITES"):
        assert word in help_text


def test_issue_cert_options() -> None:
    args = _parse("issue-cert")
    assert (args.valid, args.expired, args.key, args.out) == (300, False, None, None)
    args = _parse("issue-cert", "--valid", "1h30m", "--key", "k", "--out", "c")
    assert (args.valid, args.key, args.out) == (5400, "k", "c")
    assert _parse("issue-cert", "--expired").expired
    with pytest.raises(SystemExit):
        _parse("issue-cert", "--valid", "5m", "--expired")
    assert _parse("otp").handler.__name__ == "_otp"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("5m", 300), ("1h30m", 5400), ("2d", 172800), ("45", 45)]
)
def test_durations(text: str, seconds: int) -> None:
    assert certs.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0m", "5 minutes", "m5", "-5m", "1.5h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        certs.parse_duration(text)


def test_validity_windows() -> None:
    assert certs.validity_window(300) == "+300s"
    assert certs.validity_window(None) == certs.EXPIRED_WINDOW


def test_certificate_goes_next_to_the_key() -> None:
    assert certs.default_output(Path("/k/id_ed25519")) == Path("/k/id_ed25519-cert.pub")
    assert certs.default_output(Path("/k/id_ed25519.pub")) == Path("/k/id_ed25519-cert.pub")
    assert certs.public_key_of(Path("/k/id")) == Path("/k/id.pub")
    assert certs.public_key_of(Path("/k/id.pub")) == Path("/k/id.pub")


needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture
def cluster_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    settings = Settings(state_dir=tmp_path / "state", user="alice")
    settings.paths.ssh.mkdir(parents=True)
    _keygen(settings.paths.user_ca_key)
    _keygen(settings.paths.cert_client_key)
    return settings


@needs_keygen
def test_issued_certificate_is_for_the_user_and_valid_from_now(cluster_keys: Settings) -> None:
    issued = certs.issue_certificate(cluster_keys, valid_seconds=300)
    assert issued.path == Path(f"{cluster_keys.paths.cert_client_key}-cert.pub")
    assert issued.principal == "alice"
    now = datetime.now(UTC)
    assert issued.validity.valid_after is not None and issued.validity.valid_before is not None
    assert issued.validity.valid_after <= now
    assert timedelta(seconds=290) < issued.validity.valid_before - now <= timedelta(seconds=300)
    listing = subprocess.run(["ssh-keygen", "-L", "-f", str(issued.path)],
                             capture_output=True, text=True, check=True).stdout
    assert "Principals: \n                alice" in listing
    ca_fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{cluster_keys.paths.user_ca_key}.pub"],
        capture_output=True, text=True, check=True,
    ).stdout.split()[1]
    assert ca_fingerprint in listing


@needs_keygen
def test_expired_certificate_and_other_key_and_output(
    cluster_keys: Settings, tmp_path: Path
) -> None:
    key = tmp_path / "mine"
    _keygen(key)
    out = tmp_path / "elsewhere-cert.pub"
    issued = certs.issue_certificate(cluster_keys, key=key, out=out, valid_seconds=None)
    assert issued.path == out and out.exists()
    assert not Path(f"{key}-cert.pub").exists()
    assert issued.validity.problem(datetime.now(UTC)) is not None
    assert not list(tmp_path.glob(".issue-cert-*")), "no staging directory left behind"


@needs_keygen
def test_issuing_needs_root_a_ca_and_a_public_key(
    cluster_keys: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(DevClusterError, match="no public key"):
        certs.issue_certificate(cluster_keys, key=tmp_path / "missing")
    no_ca = Settings(state_dir=tmp_path / "other")
    with pytest.raises(DevClusterError, match="--login-sites cert"):
        certs.issue_certificate(no_ca)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NotRootError):
        certs.issue_certificate(cluster_keys)
