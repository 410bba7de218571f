"""The library at the login sites the dev cluster plays (real sshd, PAM, CA; real Dagster):
a one-time-code login node served by one shared login, a certificate-only login node, and a
Host alias that jumps through the bastion."""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from compute_support import PAYLOAD_OK, compute, materialize_one, write_payload
from login_support import CLI, at_a_terminal, unused_code

from dagster_slurm import SlurmQueueConfig, SlurmResource
from dagster_slurm.devcluster import DevCluster, DevClusterInfo
from dagster_slurm.errors import CertificateError
from dagster_slurm.logins import master
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport.login_place import LoginPlace
from dagster_slurm.transport.openssh import OpenSSHTransport

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).parent / "login_project" / "three_steps.py"
KBD_ACCEPTED = re.compile(r"Accepted keyboard-interactive/pam for (\S+)")


@pytest.fixture(scope="module")
def sites(slurm_cluster: DevClusterInfo) -> DevClusterInfo:
    return DevCluster(state_dir=slurm_cluster.state_dir, login_sites=("otp", "cert", "bastion")).up()


@pytest.fixture
def login_dir():
    with tempfile.TemporaryDirectory(prefix="lg-", dir="/tmp") as directory:
        os.chmod(directory, 0o700)
        yield directory


def _kbd_logins(info: DevClusterInfo) -> int:
    text = info.site("otp").log_path.read_text(errors="replace")
    return sum(1 for match in KBD_ACCEPTED.finditer(text) if match.group(1) == info.user)


def _site_env(info: DevClusterInfo, site: str, login_dir: str, **more: str) -> dict[str, str]:
    return {**os.environ, **info.env(), "SLURM_EDGE_NODE_PORT": str(info.site(site).port),
            "DAGSTER_SLURM_LOGIN_DIR": login_dir, **more}


def _slurm(ssh: SSHConnectionResource) -> SlurmResource:
    queue = SlurmQueueConfig(partition="cpu", time_limit="00:05:00", mem="200M", cpus=1)
    return SlurmResource(ssh=ssh, queue=queue)


# -- one-time codes ----------------------------------------------------------------------


def test_a_process_needing_a_code_fails_at_once_naming_the_login_command(sites, login_dir):
    before = _kbd_logins(sites)
    env = _site_env(sites, "otp", login_dir)
    probe = subprocess.run(
        [sys.executable, "-c", "from dagster_slurm.resources.ssh import SSHConnectionResource\n"
         "SSHConnectionResource.from_env().get_transport().run(['true'])"],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert probe.returncode != 0
    assert "LoginRequired" in probe.stderr and "needs a person" in probe.stderr
    assert f"dagster-slurm login --host 127.0.0.1 --port {sites.site('otp').port}" in probe.stderr
    assert _kbd_logins(sites) == before


def test_one_code_serves_five_runs_and_a_sensor_tick(sites, login_dir, tmp_path):
    env = _site_env(sites, "otp", login_dir,
                    LOGIN_PROJECT_PAYLOAD=write_payload(tmp_path, "ok.sh", "#!/bin/bash\ntrue\n"))
    before = _kbd_logins(sites)
    typed = at_a_terminal([*CLI, "login"], env,
                          [(r"One-time password", lambda: unused_code(sites))])
    try:
        assert typed.exit_code == 0, typed.output
        assert "One-time password" in typed.output and ": up (ssh master pid" in typed.output
        runs = [subprocess.Popen([sys.executable, str(PROJECT), "run"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for _ in range(5)]
        tick = subprocess.run([sys.executable, str(PROJECT), "sensor"], env=env,
                              capture_output=True, text=True, timeout=300)
        outputs = [run.communicate(timeout=600)[0] for run in runs]
        failed = [out[-3000:] for run, out in zip(runs, outputs, strict=True) if run.returncode]
        assert not failed, failed[0]
        assert tick.returncode == 0 and "no orphaned" in tick.stdout, tick.stdout + tick.stderr
        assert _kbd_logins(sites) - before == 1, "more than the one login asked for a code"
    finally:
        subprocess.run([*CLI, "logout"], env=env, capture_output=True, timeout=60)


# -- certificates ------------------------------------------------------------------------


def _issue(info: DevClusterInfo, key: Path, *validity: str) -> str:
    done = subprocess.run([*CLI, "dev-cluster", "issue-cert", "--state-dir", str(info.state_dir),
                           "--key", str(key), *validity], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def user_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def test_certificate_site_run_expiry_and_renewal_in_one_process(sites, user_key, tmp_path):
    ssh = SSHConnectionResource(host=sites.host, port=sites.site("cert").port, user=sites.user,
                                key_path=str(user_key), known_hosts_path=str(sites.known_hosts_path),
                                reconnect_attempts=1, shared_login="off")
    resource = compute(sites.env(), slurm=_slurm(ssh))
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    _issue(sites, user_key, "--valid", "5m")
    assert materialize_one(payload, resource).success
    transport = ssh.get_transport()
    transport.close()  # the next command logs in again, as a new process or a dropped link would
    _issue(sites, user_key, "--expired")
    with pytest.raises(CertificateError, match=r"expired at .*UTC") as caught:
        transport.run(["true"])
    assert f"{user_key}-cert.pub" in str(caught.value)
    _issue(sites, user_key, "--valid", "5m")  # renewed: picked up without a restart
    assert transport.run(["hostname"]).stdout.strip() == "login"
    assert materialize_one(payload, resource).success


def test_certificate_site_through_the_shared_login(sites, user_key, login_dir):
    env = _site_env(sites, "cert", login_dir, SLURM_EDGE_NODE_KEY_PATH=str(user_key))
    _issue(sites, user_key, "--expired")
    refused = subprocess.run([*CLI, "login"], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "expired at" in refused.stderr, refused.stderr
    _issue(sites, user_key, "--valid", "5m")
    started = subprocess.run([*CLI, "login"], env=env, capture_output=True, text=True, timeout=60)
    try:
        assert started.returncode == 0, started.stderr
        probe = subprocess.run(
            [sys.executable, "-c",
             "from dagster_slurm.resources.ssh import SSHConnectionResource\n"
             "r = SSHConnectionResource.from_env().model_copy(update={'shared_login': 'required'})\n"
             "print(r.get_transport().run(['hostname']).stdout)"],
            env=env, capture_output=True, text=True, timeout=60)
        assert probe.stdout.strip() == "login", probe.stderr
    finally:
        subprocess.run([*CLI, "logout"], env=env, capture_output=True, timeout=60)


# -- ~/.ssh/config with ProxyJump through the bastion ------------------------------------


def _ssh_config(info: DevClusterInfo, directory: Path) -> Path:
    config = directory / "ssh_config"
    config.write_text(f"""
Host devbastion
    HostName {info.host}
    Port {info.site("bastion").port}
    User {info.user}
    IdentityFile {info.key_path}
    UserKnownHostsFile {info.known_hosts_path}

Host devlogin
    HostName {info.host}
    Port {info.port}
    User {info.user}
    IdentityFile {info.key_path}
    UserKnownHostsFile {info.known_hosts_path}
    ProxyJump devbastion
""")
    return config


def _bastion_hops(info: DevClusterInfo) -> int:
    text = info.site("bastion").log_path.read_text(errors="replace")
    return text.count("Accepted publickey for")


def test_a_host_alias_with_proxyjump_through_the_bastion(sites, tmp_path, login_dir):
    config = _ssh_config(sites, tmp_path)
    ssh = SSHConnectionResource(host="devlogin", ssh_config_path=str(config), shared_login="off")
    target = ssh.to_target()
    assert target.jump is not None and target.jump.port == sites.site("bastion").port
    assert "(Host devlogin)" in target.label
    before = _bastion_hops(sites)
    resource = compute(sites.env(), slurm=_slurm(ssh))
    assert materialize_one(write_payload(tmp_path, "ok.py", PAYLOAD_OK), resource).success
    assert _bastion_hops(sites) - before == 1, "the run did not go through the bastion"
    # the same alias through a shared login: OpenSSH's ssh is pointed at the same file
    place = LoginPlace.of(target, Path(login_dir))
    assert master.start(target, place, 300).up
    try:
        assert _bastion_hops(sites) - before == 2
        shared = OpenSSHTransport(target, place=place)
        assert shared.run(["hostname"]).stdout.strip() == "login"
    finally:
        master.stop(place)
