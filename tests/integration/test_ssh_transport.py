"""The SSH transport against the dev cluster's real sshd."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import pytest

from dagster_slurm.errors import CommandTimeout, HostKeyError, TransportError
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport.ssh import SSHOptions, SSHTransport

pytestmark = pytest.mark.integration


@pytest.fixture
def ssh(slurm_cluster) -> SSHConnectionResource:
    return SSHConnectionResource.from_env(prefix="SLURM_EDGE_NODE", environ=slurm_cluster.env())


@pytest.fixture
def transport(ssh) -> SSHTransport:
    t = SSHTransport(ssh.to_target(), ssh.to_options())
    yield t
    t.close()


def test_runs_argv_literally_and_returns_streams(transport, tmp_path):
    marker = f"/tmp/dslurm-pwned-{uuid.uuid4().hex}"
    hostile = f"a; touch {marker} $(touch {marker}) `touch {marker}` 'q\"\n"
    result = transport.run(["printf", "%s", hostile])
    assert result.ok and result.stdout == hostile
    assert not transport.run(["test", "-e", marker]).ok, "a shell metacharacter was executed"
    err = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (err.exit_code, err.stdout, err.stderr) == (3, "out\n", "err\n")


def test_large_stdin_and_stdout_round_trip(transport):
    payload = bytes(range(256)) * 8192  # 2 MiB, every byte value
    result = transport.run(
        ["sh", "-c", "cat | sha256sum | cut -c1-64; head -c 3000000 /dev/zero | tr '\\0' x"],
        stdin=payload,
    )
    import hashlib

    digest, body = result.stdout[:64], result.stdout[65:]
    assert digest == hashlib.sha256(payload).hexdigest()
    assert len(body) == 3_000_000


def test_one_login_and_channel_cap(ssh):
    options = dataclasses.replace(ssh.to_options(), max_channels=2)
    transport = SSHTransport(ssh.to_target(), options)
    log = f"/tmp/dslurm-chan-{uuid.uuid4().hex}"
    script = f"echo s >> {log}; sleep 0.4; echo e >> {log}"
    try:
        threads = [
            threading.Thread(target=transport.run, args=(["sh", "-c", script],)) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        events = transport.run(["cat", log]).stdout.split()
        transport.run(["rm", "-f", log])
    finally:
        transport.close()
    running = peak = 0
    for event in events:
        running += 1 if event == "s" else -1
        peak = max(peak, running)
    assert len(events) == 12
    assert peak == 2, f"expected exactly 2 concurrent channels, saw {peak}"
    assert transport.stats.connects == 1, "more than one login for one process"


def test_reconnects_after_a_dropped_connection(transport):
    assert transport.run(["true"]).ok
    transport.drop_connection_for_test()
    assert transport.run(["echo", "again"]).stdout == "again\n"
    assert transport.stats.connects == 2


def test_connection_lost_mid_command_is_an_error_not_an_exit_code(transport):
    assert transport.run(["true"]).ok
    timer = threading.Timer(0.5, transport.drop_connection_for_test)
    timer.start()
    with pytest.raises(TransportError, match="may or may not have completed"):
        transport.run(["sleep", "5"])
    timer.join()


def test_command_timeout(transport):
    start = time.monotonic()
    with pytest.raises(CommandTimeout):
        transport.run(["sleep", "30"], timeout=1)
    assert time.monotonic() - start < 10


def test_host_key_mismatch_is_refused(ssh, tmp_path, slurm_cluster):
    original = open(ssh.known_hosts_path or "").read().split()
    # Same host entry, another ed25519 key: what a man-in-the-middle would present.
    forged = tmp_path / "known_hosts"
    forged.write_text(
        f"{original[0]} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDYtDqF3pEi1QXnZ2I9bbd/Tc0cyDcF1TgHM6SPzfzwz\n"
    )
    bad = ssh.model_copy(update={"known_hosts_path": str(forged)})
    with pytest.raises(HostKeyError, match="does not match"):
        SSHTransport(bad.to_target(), SSHOptions(reconnect_attempts=1)).run(["true"])
    # accept-new does not accept a *changed* key either
    relaxed = bad.model_copy(update={"host_key_checking": "accept-new"})
    with pytest.raises(HostKeyError):
        SSHTransport(relaxed.to_target(), SSHOptions(reconnect_attempts=1)).run(["true"])


def test_unknown_host_is_refused_unless_accept_new(ssh, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    unknown = ssh.model_copy(update={"known_hosts_path": str(empty)})
    with pytest.raises(HostKeyError, match="not in"):
        SSHTransport(unknown.to_target(), SSHOptions(reconnect_attempts=1)).run(["true"])
    tofu = unknown.model_copy(update={"host_key_checking": "accept-new"})
    assert SSHTransport(tofu.to_target(), SSHOptions(reconnect_attempts=1)).run(["true"]).ok


def test_wrong_password_never_echoes_the_secret(ssh):
    secret = "s3cr3t-" + uuid.uuid4().hex
    bad = ssh.model_copy(update={"key_path": None, "password": secret, "use_agent": False})
    with pytest.raises(TransportError) as info:
        SSHTransport(bad.to_target(), SSHOptions(reconnect_attempts=1)).run(["true"])
    assert secret not in str(info.value)
    assert secret not in repr(bad)
