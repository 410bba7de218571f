"""One-time codes of the otp login site: RFC 6238 arithmetic, the secret and pam_oath's
users file, and how the PAM service reaches sshd."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dagster_slurm.devcluster import otp
from dagster_slurm.devcluster.errors import DevClusterError, NotRootError
from dagster_slurm.devcluster.layout import Paths

#: RFC 6238 appendix B, SHA1 column: (Unix time, 8-digit code) for the ASCII secret below.
RFC_SECRET = b"12345678901234567890"
RFC_VECTORS = [
    (59, "94287082"),
    (1111111109, "07081804"),
    (1111111111, "14050471"),
    (1234567890, "89005924"),
    (2000000000, "69279037"),
    (20000000000, "65353130"),
]


@pytest.mark.parametrize(("at", "code"), RFC_VECTORS)
def test_totp_matches_the_rfc_6238_vectors(at: int, code: str) -> None:
    assert otp.totp(RFC_SECRET, at, digits=8) == code


@pytest.mark.parametrize(("at", "code"), RFC_VECTORS)
def test_six_digit_codes_are_the_last_six_digits(at: int, code: str) -> None:
    assert otp.totp(RFC_SECRET, at) == code[-6:]


def test_one_code_per_thirty_second_step() -> None:
    assert otp.time_step(59) == 1 and otp.time_step(60) == 2
    assert otp.totp(RFC_SECRET, 60) == otp.totp(RFC_SECRET, 89.9)
    assert otp.totp(RFC_SECRET, 60) != otp.totp(RFC_SECRET, 90)


def test_users_line_declares_totp_without_password() -> None:
    line = otp.users_line("dslurm", bytes(range(20)))
    assert line.split() == ["HOTP/T30/6", "dslurm", "-", bytes(range(20)).hex()]


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    paths = Paths(tmp_path)
    paths.secrets.mkdir()
    return paths


def test_secret_is_generated_once_and_root_only(paths: Paths) -> None:
    secret = otp.ensure_secret(paths, "dslurm")
    assert len(secret) == 20
    assert otp.ensure_secret(paths, "dslurm") == secret
    for path in (paths.otp_secret, paths.otp_users):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert paths.otp_users.read_text() == otp.users_line("dslurm", secret)


def test_users_file_updated_by_pam_oath_is_kept(paths: Paths) -> None:
    secret = otp.ensure_secret(paths, "dslurm")
    used = f"HOTP/T30/6\tdslurm\t-\t{secret.hex()}\t0\t123456\t2026-01-31T12:00:00L\n"
    paths.otp_users.write_text(used)
    otp.ensure_secret(paths, "dslurm")
    assert paths.otp_users.read_text() == used, "rewriting it would allow a replayed code"


def test_users_file_follows_a_new_user(paths: Paths) -> None:
    secret = otp.ensure_secret(paths, "dslurm")
    otp.ensure_secret(paths, "alice")
    assert paths.otp_users.read_text() == otp.users_line("alice", secret)


def test_current_code_is_the_code_of_the_stored_secret(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    secret = otp.ensure_secret(paths, "dslurm")
    assert otp.current_code(paths, at=1234567890) == otp.totp(secret, 1234567890)


def test_codes_are_for_root_only(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    otp.ensure_secret(paths, "dslurm")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NotRootError, match="only root can read"):
        otp.current_code(paths)


def test_no_secret_says_how_to_start_the_site(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(DevClusterError, match="--login-sites otp"):
        otp.current_code(paths)


def test_program_link_is_named_after_the_pam_service(paths: Paths) -> None:
    link = otp.program_link(paths, "/usr/sbin/sshd")
    assert link.name == otp.PAM_SERVICE and os.readlink(link) == "/usr/sbin/sshd"
    assert otp.program_link(paths, "/usr/local/sbin/sshd") == link
    assert os.readlink(link) == "/usr/local/sbin/sshd"
