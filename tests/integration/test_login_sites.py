"""The login sites of the dev cluster, against their real sshds.

``otp`` asks for the key and then a one-time code (pam_oath through the site's own PAM
service); ``cert`` accepts only fresh certificates of the cluster's user CA; ``bastion``
forwards to the login node. Every way in reaches the same login node and Slurm cluster.
Logins that need a code drive the real ``ssh`` in a pseudo-terminal; each code works
once, so a later login types the code of a later 30 s step (waiting, with a deadline, when
the codes the site accepts now are used up).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest
from login_support import at_a_terminal, unused_code

from dagster_slurm.cli import main
from dagster_slurm.devcluster import DevCluster, DevClusterInfo
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.devcluster.layout import LOGIN_SITES
from dagster_slurm.devcluster.otp import read_secret, time_step, totp
from dagster_slurm.errors import AuthenticationFailed, CertificateError
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport.ssh import SSHTransport

pytestmark = pytest.mark.integration

CODE_PROMPT = b"One-time password"
KBD_ACCEPTED = re.compile(r"Accepted keyboard-interactive/pam for (\S+)")
KEY_ACCEPTED = re.compile(r"Accepted publickey for (\S+)")


@pytest.fixture(scope="module")
def sites(slurm_cluster: DevClusterInfo) -> DevClusterInfo:
    """The cluster with all login sites up (they stay up after the tests)."""
    return DevCluster(state_dir=slurm_cluster.state_dir, login_sites=LOGIN_SITES).up()


def _wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)


def _log_count(path: Path, pattern: re.Pattern[str], user: str) -> int:
    text = path.read_text(errors="replace") if path.exists() else ""
    return sum(1 for match in pattern.finditer(text) if match.group(1) == user)


def _ssh_options(info: DevClusterInfo) -> list[str]:
    return ["-o", f"UserKnownHostsFile={info.known_hosts_path}", "-o", "StrictHostKeyChecking=yes",
            "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10"]


def _openssh(info: DevClusterInfo, port: int, key: Path, *command: str,
             extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", *_ssh_options(info), "-o", "BatchMode=yes", *extra, "-i", str(key),
            "-p", str(port), f"{info.user}@{info.host}", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)


# -- one-time codes --------------------------------------------------------------------


def _otp_login(info: DevClusterInfo, code: str, command: str) -> tuple[int | None, str]:
    argv = ["ssh", *_ssh_options(info), "-i", str(info.key_path),
            "-p", str(info.site("otp").port), f"{info.user}@{info.host}", command]
    typed = at_a_terminal(argv, os.environ, [(CODE_PROMPT.decode(), lambda: code)], timeout=40)
    return (None if typed.asked_again else typed.exit_code), typed.output


def test_otp_site_refuses_the_key_alone_and_offers_keyboard_interactive(
    sites: DevClusterInfo,
) -> None:
    site = sites.site("otp")
    key = paramiko.PKey.from_path(str(sites.key_path))
    with paramiko.Transport((site.host, site.port)) as transport:
        transport.start_client(timeout=10)
        remaining = transport.auth_publickey(sites.user, key)
        assert remaining == ["keyboard-interactive"]
        assert not transport.is_authenticated()
    batch = _openssh(sites, site.port, sites.key_path, "hostname")
    assert batch.returncode == 255 and "keyboard-interactive" in batch.stderr


def test_otp_site_logs_in_with_key_and_code_once_per_code(sites: DevClusterInfo) -> None:
    log, user = sites.site("otp").log_path, sites.user
    before = _log_count(log, KBD_ACCEPTED, user)
    code = unused_code(sites)
    status, output = _otp_login(sites, code, "hostname; squeue --noheader --format=%P | wc -l")
    assert status == 0, output
    lines = output.strip().splitlines()
    assert lines[-2:][0].strip() == "login" and lines[-1].strip().isdigit(), output
    _wait_until(lambda: _log_count(log, KBD_ACCEPTED, user) == before + 1, 10,
                "one keyboard-interactive acceptance in the log")

    replayed, output = _otp_login(sites, code, "hostname")
    assert replayed is None, f"a used code logged in again: {output}"
    assert _log_count(log, KBD_ACCEPTED, user) == before + 1

    status, output = _otp_login(sites, unused_code(sites),
                                "sbatch --parsable --time=1 --output=/dev/null --wrap=true")
    assert status == 0, output
    job_id = output.strip().splitlines()[-1].split(";")[0].strip()
    assert job_id.isdigit(), output
    _wait_until(lambda: _log_count(log, KBD_ACCEPTED, user) == before + 2, 10,
                "a second keyboard-interactive acceptance")
    _assert_job_known(sites, job_id)


def _assert_job_known(info: DevClusterInfo, job_id: str) -> None:
    """The job is in the dev cluster's accounting or queue (the same Slurm cluster)."""
    env = {**os.environ, "SLURM_CONF": str(info.slurm_conf)}

    def known() -> bool:
        out = subprocess.run([slurm_command(env, "sacct"), "-X", "-n", "-P", "-j", job_id, "-o", "JobID"], env=env,
                             capture_output=True, text=True, check=False).stdout
        return job_id in out.split()

    _wait_until(known, 20, f"job {job_id} in the cluster's accounting")


def test_otp_command_prints_the_current_code(
    sites: DevClusterInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = read_secret(DevCluster(state_dir=sites.state_dir).paths)
    step = time_step(time.time())
    assert main(["dev-cluster", "otp", "--state-dir", str(sites.state_dir)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed in {totp(secret, s * 30) for s in (step, step + 1)}


# -- certificates ----------------------------------------------------------------------


@pytest.fixture
def user_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def _cert_resource(info: DevClusterInfo, key: Path) -> SSHConnectionResource:
    return SSHConnectionResource(
        host=info.host, port=info.site("cert").port, user=info.user, key_path=str(key),
        known_hosts_path=str(info.known_hosts_path), connect_timeout=10, reconnect_attempts=1,
    )


def test_cert_site_refuses_a_key_without_certificate(
    sites: DevClusterInfo, user_key: Path
) -> None:
    port = sites.site("cert").port
    assert _openssh(sites, port, user_key, "true").returncode == 255
    assert _openssh(sites, port, sites.key_path, "true").returncode == 255, (
        "the cert site accepted a key from authorized_keys"
    )
    transport = SSHTransport(_cert_resource(sites, user_key).to_target())
    with pytest.raises(AuthenticationFailed, match="refused the login"):
        transport.run(["true"])
    transport.close()


def test_cert_site_accepts_a_fresh_certificate(
    sites: DevClusterInfo, user_key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = sites.site("cert").log_path
    before = _log_count(log, KEY_ACCEPTED, sites.user)
    assert main(["dev-cluster", "issue-cert", "--state-dir", str(sites.state_dir),
                 "--valid", "5m", "--key", str(user_key)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{user_key}-cert.pub" and "valid from" in printed[1]

    transport = SSHTransport(_cert_resource(sites, user_key).to_target())
    try:
        assert transport.run(["hostname"]).stdout.strip() == "login"
        job = transport.run(["sbatch", "--parsable", "--time=1", "--output=/dev/null",
                             "--wrap=true"])
        assert job.ok, job.stderr
    finally:
        transport.close()
    _assert_job_known(sites, job.stdout.strip().split(";")[0])

    ssh = _openssh(sites, sites.site("cert").port, user_key, "hostname")
    assert (ssh.returncode, ssh.stdout.strip()) == (0, "login"), ssh.stderr
    _wait_until(lambda: _log_count(log, KEY_ACCEPTED, sites.user) == before + 2, 10,
                "two certificate logins in the log")
    assert f"ID {sites.user}@dagster-slurm-dev-cluster" in log.read_text()


def test_cert_site_refuses_an_expired_certificate(
    sites: DevClusterInfo, user_key: Path
) -> None:
    assert main(["dev-cluster", "issue-cert", "--state-dir", str(sites.state_dir),
                 "--expired", "--key", str(user_key)]) == 0
    log = sites.site("cert").log_path
    expired_before = log.read_text().count("Certificate invalid: expired")
    ssh = _openssh(sites, sites.site("cert").port, user_key, "true")
    assert ssh.returncode == 255
    _wait_until(lambda: log.read_text().count("Certificate invalid: expired") > expired_before,
                10, "the server's refusal of the expired certificate")
    key = paramiko.PKey.from_path(str(user_key))  # loads <key>-cert.pub as well
    site = sites.site("cert")
    with paramiko.Transport((site.host, site.port)) as transport:
        transport.start_client(timeout=10)
        with pytest.raises(paramiko.AuthenticationException):
            transport.auth_publickey(sites.user, key)
    with pytest.raises(CertificateError, match="expired"):
        SSHTransport(_cert_resource(sites, user_key).to_target()).run(["true"])


def test_issue_cert_defaults_to_the_cluster_certificate_key(sites: DevClusterInfo) -> None:
    assert sites.cert_key_path is not None
    assert main(["dev-cluster", "issue-cert", "--state-dir", str(sites.state_dir)]) == 0
    ssh = _openssh(sites, sites.site("cert").port, sites.cert_key_path, "hostname")
    assert (ssh.returncode, ssh.stdout.strip()) == (0, "login"), ssh.stderr
    login = _openssh(sites, sites.port, sites.cert_key_path, "true")
    assert login.returncode == 255, "the certificate key is not a key of the login node"


# -- bastion ---------------------------------------------------------------------------


def _client_config(info: DevClusterInfo, tmp_path: Path) -> Path:
    """An ssh_config for every host: the cluster's key and known_hosts (ssh passes -F on
    to the jump host's connection, which -i and -o do not reach)."""
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host *\n"
        f"  IdentityFile {info.key_path}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {info.known_hosts_path}\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  ConnectTimeout 10\n"
    )
    return config


def test_bastion_is_a_host_of_its_own_that_jumps_to_the_login_node(
    sites: DevClusterInfo, tmp_path: Path
) -> None:
    config = _client_config(sites, tmp_path)
    bastion = sites.site("bastion")
    log = bastion.log_path
    target = f"{sites.user}@{sites.host}"

    def ssh(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ssh", "-F", str(config), *argv], capture_output=True, text=True,
                              timeout=60, check=False, stdin=subprocess.DEVNULL)

    direct = ssh("-p", str(bastion.port), target, "hostname")
    assert (direct.returncode, direct.stdout.strip()) == (0, "bastion"), direct.stderr
    before = _log_count(log, KEY_ACCEPTED, sites.user)
    jumped = ssh("-J", f"{target}:{bastion.port}", "-p", str(sites.port), target,
                 "hostname; squeue --noheader --format=%i | wc -l")
    assert jumped.returncode == 0, jumped.stderr
    assert jumped.stdout.split()[0] == "login", jumped.stdout
    _wait_until(lambda: _log_count(log, KEY_ACCEPTED, sites.user) == before + 1, 10,
                "the jump's login in the bastion's log")
    elsewhere = ssh("-J", f"{target}:{bastion.port}", "-p", "16817", target, "true")
    assert elsewhere.returncode == 255, "the bastion forwarded to a port other than sshd's"


def test_library_reaches_the_login_node_through_the_bastion(sites: DevClusterInfo) -> None:
    bastion = sites.site("bastion")
    common = {"user": sites.user, "key_path": str(sites.key_path),
              "known_hosts_path": str(sites.known_hosts_path), "connect_timeout": 10}
    jump = SSHConnectionResource(host=bastion.host, port=bastion.port, **common)
    login = SSHConnectionResource(host=sites.host, port=sites.port, jump_host=jump,
                                  reconnect_attempts=1, **common)
    before = _log_count(bastion.log_path, KEY_ACCEPTED, sites.user)
    transport = SSHTransport(login.to_target(), login.to_options())
    try:
        assert transport.run(["hostname"]).stdout.strip() == "login"
    finally:
        transport.close()
    _wait_until(lambda: _log_count(bastion.log_path, KEY_ACCEPTED, sites.user) == before + 1,
                10, "the library's login at the bastion")


# -- lifecycle -------------------------------------------------------------------------


def test_env_status_and_second_up_with_sites(
    sites: DevClusterInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = str(sites.state_dir)
    assert main(["dev-cluster", "env", "--state-dir", state_dir]) == 0
    exported = dict(line.removeprefix("export ").split("=", 1)
                    for line in capsys.readouterr().out.splitlines())
    for name, offset in (("OTP", 1), ("CERT", 2), ("BASTION", 3)):
        assert exported[f"DAGSTER_SLURM_DEV_{name}_PORT"] == str(sites.port + offset)
        assert Path(exported[f"DAGSTER_SLURM_DEV_{name}_LOG"]).is_file()
    cluster = DevCluster(state_dir=sites.state_dir)
    before = {d.name: d.pid for d in cluster.status().daemons}
    assert {"sshd-otp", "sshd-cert", "sshd-bastion"} <= set(before)
    assert cluster.up() == sites
    after = cluster.status()
    assert after.ok and {d.name: d.pid for d in after.daemons} == before
    hosts = {line.split()[0] for line in sites.known_hosts_path.read_text().splitlines()}
    assert hosts >= {f"[{sites.host}]:{sites.port + n}" for n in range(4)}


def test_sites_not_chosen_are_stopped_and_come_back(sites: DevClusterInfo) -> None:
    ports = [site.port for site in sites.login_sites]
    without = DevCluster(state_dir=sites.state_dir, login_sites=()).up()
    assert without.login_sites == ()
    names = {d.name for d in DevCluster(state_dir=sites.state_dir).status().daemons}
    assert not names & {"sshd-otp", "sshd-cert", "sshd-bastion"}
    assert DevCluster(state_dir=sites.state_dir).status().ok
    for port in ports:
        _wait_until(lambda port=port: not _port_open(sites.host, port), 10, f"port {port} closed")
    again = DevCluster(state_dir=sites.state_dir, login_sites=LOGIN_SITES).up()
    assert again == sites


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
