"""How commands through a shared login report what happened (pure logic, with a stand-in
``ssh`` program that runs commands locally; the real master is tested on the dev cluster)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from dagster_slurm.errors import LoginRequired, RemoteProgramEnded, TransportError
from dagster_slurm.transport.choice import ChosenTransport
from dagster_slurm.transport.login_place import LoginPlace
from dagster_slurm.transport.openssh import OpenSSHTransport
from dagster_slurm.transport.ssh_target import SSHOptions, SSHTarget

FAKE_SSH = textwrap.dedent(f"""\
    #!{sys.executable}
    # Stands in for ssh as a client of a master: the master is "up" while the socket file
    # exists and no "<socket>.dead" file does.
    import os, subprocess, sys
    argv = sys.argv[1:]
    sock = argv[argv.index("-S") + 1]
    up = os.path.exists(sock) and not os.path.exists(sock + ".dead")
    if "-O" in argv:
        if up:
            print("Master running (pid=4242)", file=sys.stderr)
            sys.exit(0)
        print(f"Control socket connect({{sock}}): Connection refused", file=sys.stderr)
        sys.exit(255)
    if not up:
        print("kex_exchange_identification: Connection closed by remote host", file=sys.stderr)
        sys.exit(255)
    command = argv[argv.index("--") + 1]
    sys.exit(subprocess.call(["bash", "-c", command]))
""")


@pytest.fixture
def shared(tmp_path):
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    target = SSHTarget("login", 22, "alice")
    place = LoginPlace.of(target, tmp_path / "logins")
    place.directory.mkdir(mode=0o700)
    place.socket.write_text("")
    # native=False: the stand-in is an ssh program, not a master speaking the mux protocol
    return OpenSSHTransport(target, place=place, ssh=str(ssh), native=False)


def test_commands_run_with_their_own_status_and_input(shared):
    result = shared.run(["bash", "-c", "cat; echo err >&2; exit 3"], stdin=b"in")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "in", "err\n")


def test_a_remote_status_255_is_the_commands_while_the_master_is_up(shared):
    assert shared.run(["bash", "-c", "exit 255"]).exit_code == 255


def test_no_socket_means_login_required_naming_the_command(shared):
    shared.place.socket.unlink()
    with pytest.raises(LoginRequired, match="dagster-slurm login --host login --port 22"):
        shared.run(["true"])


def test_a_master_that_ended_is_login_required_never_a_result(shared):
    (shared.place.socket.parent / (shared.place.socket.name + ".dead")).write_text("")
    with pytest.raises(LoginRequired, match="may or may not have completed"):
        shared.run(["true"])


def test_a_stream_answers_lines_and_tells_an_ended_program_from_a_lost_login(shared):
    stream = shared.open_stream(["bash", "-c", "read line; echo got $line"])
    stream.send(b"one\n")
    assert stream.readline(10) == b"got one\n"
    assert stream.readline(10) == b""
    assert stream.exit_code() == 0
    with pytest.raises(RemoteProgramEnded):
        stream.send(b"two\n" * 100_000)
    stream.close()
    lost = shared.open_stream(["cat"])
    (shared.place.socket.parent / (shared.place.socket.name + ".dead")).write_text("")
    lost.close()
    with pytest.raises(LoginRequired):
        shared.open_stream(["cat"]).readline(10)


def test_required_mode_never_logs_in_itself(tmp_path):
    target = SSHTarget("127.0.0.1", 1, "alice")
    chosen = ChosenTransport(target, mode="required",
                             place=LoginPlace.of(target, tmp_path / "logins"))
    with pytest.raises(LoginRequired, match="is not up"):
        chosen.run(["true"])
    assert chosen.stats.connects == 0


def test_auto_mode_without_a_shared_login_logs_in_itself(tmp_path):
    target = SSHTarget("127.0.0.1", 1, "alice", allow_agent=False, host_key_checking="off")
    chosen = ChosenTransport(target, SSHOptions(reconnect_attempts=1), mode="auto",
                             place=LoginPlace.of(target, tmp_path / "logins"))
    with pytest.raises(TransportError, match="refused the TCP connection") as caught:
        chosen.run(["true"])
    assert not isinstance(caught.value, LoginRequired)
    assert chosen.mechanism == "paramiko"
