"""OpenSSH certificates next to the key: their validity is checked, and a renewal command
run, before a login; nothing connects when the certificate cannot be used.

Certificates are signed here with the real ``ssh-keygen`` (a CA key and a user key in
``tmp_path``). The TCP connection is replaced by a stand-in that records that it was
reached and refuses with :class:`AuthenticationFailed` (which is not retried), so a test
sees whether the login got as far as connecting."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from dagster_slurm.errors import AuthenticationFailed, CertificateError, ConfigurationError
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport import certificates, ssh_login
from dagster_slurm.transport.certificates import parse_validity, prepare_certificate
from dagster_slurm.transport.ssh import SSHOptions, SSHTarget, SSHTransport

SSH_KEYGEN = shutil.which("ssh-keygen")
UTC = timezone.utc


class Keys:
    """A CA key and a user key in a directory; :meth:`sign` writes ``user-cert.pub``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = root / "ca"
        self.user = root / "user"
        self.cert = root / "user-cert.pub"
        for path in (self.ca, self.user):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                           check=True)

    def sign(self, validity: str) -> None:
        subprocess.run(["ssh-keygen", "-q", "-s", str(self.ca), "-I", "id", "-n", "alice",
                        "-V", validity, str(self.user) + ".pub"], check=True)

    def script(self, name: str, body: str) -> list[str]:
        """An executable shell script in the directory, as an argument list."""
        path = self.root / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return [str(path)]

    def renewer(self, validity: str = "+1h") -> list[str]:
        """A renewal command that signs a fresh certificate and counts its runs in ``runs``."""
        return self.script("renew.sh", f"echo run >> {self.root / 'runs'}\n"
                           f"ssh-keygen -q -s {self.ca} -I id -n alice -V {validity} "
                           f"{self.user}.pub\n")

    def runs(self) -> int:
        path = self.root / "runs"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def target(self, command: list[str] | None = None, minimum: float = 300.0) -> SSHTarget:
        return SSHTarget("127.0.0.1", 2222, "alice", key_path=str(self.user),
                         host_key_checking="off",
                         certificate_renew_command=tuple(command) if command else None,
                         certificate_min_validity=minimum)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    if SSH_KEYGEN is None:
        pytest.skip("ssh-keygen is not installed")
    return Keys(tmp_path)


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Targets the login tried to open a TCP connection to; each attempt is refused."""
    reached: list[str] = []

    def refuse(target: SSHTarget, timeout: float) -> object:
        reached.append(target.label)
        raise AuthenticationFailed("connection reached")

    monkeypatch.setattr(ssh_login, "open_tcp", refuse)
    return reached


def _login(target: SSHTarget) -> BaseException:
    transport = SSHTransport(target, SSHOptions(connect_timeout=1, reconnect_attempts=1))
    with pytest.raises(AuthenticationFailed) as caught:
        transport.run(["true"], timeout=5)
    transport.close()
    return caught.value


# -- reading the validity ------------------------------------------------------------------


def test_validity_lines_of_ssh_keygen_are_understood() -> None:
    start, end = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2026, 1, 2, 4, 4, 5,
                                                                     tzinfo=UTC)
    listing = "c:\n        Serial: 0\n        Valid: from 2026-01-02T03:04:05 to 2026-01-02T04:04:05\n"
    assert parse_validity("c", listing) == certificates.Validity("c", start, end)
    assert parse_validity("c", "  Valid: forever\n") == certificates.Validity("c", None, None)
    assert parse_validity("c", "Valid: after 2026-01-02T03:04:05").valid_after == start
    assert parse_validity("c", "Valid: before 2026-01-02T04:04:05").valid_before == end
    with pytest.raises(ValueError, match="no 'Valid:' line"):
        parse_validity("c", "Type: ssh-ed25519-cert-v01@openssh.com user certificate")


def test_validity_of_signed_certificates(keys: Keys) -> None:
    target = keys.target()
    now = datetime.now(UTC)
    keys.sign("+1h")
    validity = certificates.read_validity(target, str(keys.cert))
    assert validity is not None and validity.problem(now) is None
    assert 3500 < validity.remaining(now) <= 3600
    keys.sign("-2h:-1h")
    expired = certificates.read_validity(target, str(keys.cert))
    assert expired is not None and expired.valid_before is not None
    assert abs((now - timedelta(hours=1) - expired.valid_before).total_seconds()) < 60
    assert expired.problem(now) == (f"the certificate {keys.cert} expired at "
                                    f"{certificates.shown_time(expired.valid_before)}")
    keys.sign("always:forever")
    forever = certificates.read_validity(target, str(keys.cert))
    assert forever == certificates.Validity(str(keys.cert), None, None)
    assert forever.problem(now) is None


def test_a_file_that_is_not_a_certificate_is_refused(keys: Keys) -> None:
    keys.cert.write_text("not a certificate\n")
    with pytest.raises(CertificateError, match=r"user-cert.pub cannot be read \(ssh-keygen -L "
                                               r"exited with status \d+"):
        prepare_certificate(keys.target())


# -- without a renewal command -------------------------------------------------------------


def test_an_expired_certificate_fails_the_login_before_connecting(
        keys: Keys, connects: list[str]) -> None:
    keys.sign("-2h:-1h")
    error = _login(keys.target())
    assert isinstance(error, CertificateError)
    assert connects == []
    text = str(error)
    assert text.startswith(f"SSH login to alice@127.0.0.1:2222 (key {keys.user}) failed: the "
                           f"certificate {keys.cert} expired at ")
    assert " UTC. Check the certificate: sign a fresh one, or set certificate_renew_command" in text


def test_a_certificate_not_valid_yet_fails_the_login(keys: Keys, connects: list[str]) -> None:
    keys.sign("+1h:+2h")
    error = _login(keys.target())
    assert isinstance(error, CertificateError)
    assert f"the certificate {keys.cert} is not valid before " in str(error)
    assert connects == []


def test_a_renewed_file_is_read_again_at_the_next_login(keys: Keys, connects: list[str]) -> None:
    keys.sign("-2h:-1h")
    transport = SSHTransport(keys.target(), SSHOptions(connect_timeout=1, reconnect_attempts=1))
    with pytest.raises(CertificateError):
        transport.run(["true"], timeout=5)
    keys.sign("always:forever")
    with pytest.raises(AuthenticationFailed, match="connection reached"):
        transport.run(["true"], timeout=5)
    assert connects == ["alice@127.0.0.1:2222"]


def test_a_key_without_certificate_logs_in_as_before(keys: Keys, connects: list[str]) -> None:
    assert "connection reached" in str(_login(keys.target()))
    assert len(connects) == 1


def test_without_ssh_keygen_the_check_is_skipped_with_a_warning(
        keys: Keys, connects: list[str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    keys.sign("-2h:-1h")
    monkeypatch.setattr(certificates.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.ssh"):
        assert "connection reached" in str(_login(keys.target()))
    assert "ssh-keygen is not on the PATH" in caplog.text


# -- with a renewal command ----------------------------------------------------------------


def test_the_command_runs_when_the_certificate_is_missing(keys: Keys, connects: list[str]) -> None:
    assert not keys.cert.exists()
    assert "connection reached" in str(_login(keys.target(keys.renewer())))
    assert keys.runs() == 1 and keys.cert.exists()
    assert len(connects) == 1


def test_the_command_runs_when_the_certificate_expires_soon(keys: Keys,
                                                            connects: list[str]) -> None:
    keys.sign("-1h:+2m")
    assert "connection reached" in str(_login(keys.target(keys.renewer(), minimum=300)))
    assert keys.runs() == 1
    validity = certificates.read_validity(keys.target(), str(keys.cert))
    assert validity is not None and validity.remaining(datetime.now(UTC)) > 3000


def test_the_command_renews_an_expired_certificate(keys: Keys, connects: list[str]) -> None:
    keys.sign("-2h:-1h")
    assert "connection reached" in str(_login(keys.target(keys.renewer())))
    assert keys.runs() == 1


def test_the_command_does_not_run_for_a_certificate_valid_long_enough(
        keys: Keys, connects: list[str]) -> None:
    keys.sign("+1h")
    assert "connection reached" in str(_login(keys.target(keys.renewer(), minimum=300)))
    keys.sign("always:forever")
    assert "connection reached" in str(_login(keys.target(keys.renewer(), minimum=300)))
    assert keys.runs() == 0
    assert len(connects) == 2


def test_a_failing_command_names_itself_its_status_and_its_last_stderr_lines(
        keys: Keys, connects: list[str]) -> None:
    lines = "".join(f"echo 'line {n}' >&2\n" for n in range(1, 16))
    command = keys.script("renew.sh", lines + "exit 3\n") + ["--provisioner", "oidc"]
    error = _login(keys.target(command))
    assert isinstance(error, CertificateError)
    assert connects == []
    text = str(error)
    assert (f"the certificate renewal command {command!r} (certificate_renew_command) exited "
            "with status 3: line 6 | line 7 |") in text
    assert "line 15. Check the command's own output above" in text
    assert "line 5 |" not in text


def test_a_command_that_leaves_an_expired_certificate_is_an_error(
        keys: Keys, connects: list[str]) -> None:
    command = keys.renewer(validity="-2h:-1h")
    error = _login(keys.target(command))
    assert isinstance(error, CertificateError)
    assert f"the certificate {keys.cert} expired at " in str(error)
    assert (f"after the certificate renewal command {command!r} (certificate_renew_command) "
            "exited with status 0") in str(error)
    assert connects == []


def test_a_command_that_writes_no_certificate_is_an_error(keys: Keys,
                                                          connects: list[str]) -> None:
    command = keys.script("renew.sh", "echo 'nothing to do' >&2\n")
    error = _login(keys.target(command))
    assert f"exited with status 0, but {keys.cert} does not exist; its output: nothing to do" \
        in str(error)
    assert connects == []


def test_a_command_that_cannot_be_started_is_an_error(keys: Keys, connects: list[str]) -> None:
    missing = str(keys.root / "no-such-program")
    error = _login(keys.target([missing]))
    assert isinstance(error, CertificateError)
    assert f"the certificate renewal command {[missing]!r} (certificate_renew_command) could " \
        "not be started (No such file or directory)" in str(error)


def test_the_command_gets_no_terminal_and_no_input(keys: Keys, connects: list[str]) -> None:
    probe = keys.root / "probe"
    command = keys.script("renew.sh", f"if [ -t 0 ]; then echo tty; else echo no-tty; fi > {probe}\n"
                          f"cat >> {probe}\n"
                          f"(: < /dev/tty) 2>/dev/null && echo has-tty >> {probe}\n"
                          f"ssh-keygen -q -s {keys.ca} -I id -n alice -V +1h {keys.user}.pub\n")
    _login(keys.target(command))
    assert probe.read_text() == "no-tty\n"


# -- configuration -------------------------------------------------------------------------


def _configuration_error(**fields: object) -> ConfigurationError:
    with pytest.raises(ValidationError) as caught:
        SSHConnectionResource(host="login", user="alice", **fields)
    error = caught.value.errors()[0]["ctx"]["error"]
    assert isinstance(error, ConfigurationError)
    return error


@pytest.mark.parametrize("command", [[], [""], ["step", ""]])
def test_the_command_must_be_a_non_empty_list_of_non_empty_strings(command: list[str]) -> None:
    error = _configuration_error(key_path="~/.ssh/id", certificate_renew_command=command)
    assert error.field == "certificate_renew_command"
    assert "non-empty list of non-empty strings" in str(error)


def test_the_command_needs_key_path() -> None:
    error = _configuration_error(certificate_renew_command=["step", "ssh", "login"])
    assert error.field == "certificate_renew_command"
    assert "needs key_path" in str(error)


def test_a_negative_minimum_validity_is_refused() -> None:
    error = _configuration_error(certificate_min_validity_seconds=-1)
    assert error.field == "certificate_min_validity_seconds"


def test_the_settings_reach_the_login_target() -> None:
    resource = SSHConnectionResource(host="login", user="alice", key_path="~/.ssh/id",
                                     certificate_renew_command=["step", "ssh", "login"],
                                     certificate_min_validity_seconds=600)
    target = resource.to_target()
    assert target.certificate_renew_command == ("step", "ssh", "login")
    assert target.certificate_min_validity == 600
    assert hash(target)
    assert SSHConnectionResource(host="login", user="alice").to_target() \
        .certificate_renew_command is None
    assert os.path.basename(certificates.certificate_path("~/.ssh/id")) == "id-cert.pub"
