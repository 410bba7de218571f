"""The development cluster behaves like a small real Slurm site.

Jobs are submitted over a real SSH login as the non-root submitter; nodes have their
own hostnames and addresses; GPU GRES come with CUDA_VISIBLE_DEVICES; accounting works;
``up`` is idempotent.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from dagster_slurm.cli import main
from dagster_slurm.devcluster import DevCluster, DevClusterInfo

pytestmark = pytest.mark.integration


def _ssh_run(client: paramiko.SSHClient, argv: list[str], timeout: float = 60.0) -> str:
    """Run ``argv`` on the login node; return stdout, failing the test on a non-zero exit."""
    _, stdout, stderr = client.exec_command(shlex.join(argv), timeout=timeout)
    out: str = stdout.read().decode()
    err: str = stderr.read().decode()
    code = stdout.channel.recv_exit_status()
    assert code == 0, f"{argv} exited {code}: {err}{out}"
    return out


@pytest.fixture(scope="module")
def ssh(slurm_cluster: DevClusterInfo) -> Iterator[paramiko.SSHClient]:
    client = paramiko.SSHClient()
    client.load_host_keys(str(slurm_cluster.known_hosts_path))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        slurm_cluster.host,
        port=slurm_cluster.port,
        username=slurm_cluster.user,
        key_filename=str(slurm_cluster.key_path),
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def job_dir(ssh: paramiko.SSHClient, slurm_cluster: DevClusterInfo) -> str:
    path = f"{slurm_cluster.deployment_base_path}/test-dev-cluster"
    _ssh_run(ssh, ["mkdir", "-p", path])
    return path


def _sbatch_wait(
    ssh: paramiko.SSHClient, job_dir: str, *options: str, wrap: str
) -> tuple[str, str]:
    """Submit with ``sbatch --wait``; return (job id, job output)."""
    out_file = f"{job_dir}/%j.out"
    argv = ["sbatch", "--wait", "--parsable", "--time=00:02:00", f"--output={out_file}"]
    job_id = _ssh_run(ssh, [*argv, *options, f"--wrap={wrap}"]).strip().split(";")[0]
    return job_id, _ssh_run(ssh, ["cat", f"{job_dir}/{job_id}.out"])


@pytest.fixture(scope="module")
def two_node_job(
    ssh: paramiko.SSHClient, job_dir: str, slurm_cluster: DevClusterInfo
) -> tuple[str, str]:
    return _sbatch_wait(
        ssh,
        job_dir,
        f"--partition={slurm_cluster.partition}",
        "--nodes=2",
        "--ntasks-per-node=1",
        wrap='srun -l sh -c "id -un; hostname; hostname -i"',
    )


def _sinfo_nodes(info: DevClusterInfo) -> list[tuple[str, str, str]]:
    proc = subprocess.run(
        [info.slurm_command("sinfo"), "-h", "-N", "-o", "%N %P %T"],
        env={**os.environ, "SLURM_CONF": str(info.slurm_conf)},
        capture_output=True,
        text=True,
        check=True,
    )
    return [tuple(line.split()) for line in proc.stdout.splitlines()]  # type: ignore[misc]


def test_sinfo_shows_idle_nodes_in_both_partitions(slurm_cluster: DevClusterInfo) -> None:
    deadline = time.monotonic() + 15
    while True:
        rows = _sinfo_nodes(slurm_cluster)
        if all(state == "idle" for _, _, state in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len({node for node, _, _ in rows}) >= 4
    assert all(state == "idle" for _, _, state in rows), rows
    by_partition: dict[str, set[str]] = {p.rstrip("*"): set() for _, p, _ in rows}
    for node, partition, _ in rows:
        by_partition[partition.rstrip("*")].add(node)
    assert by_partition[slurm_cluster.partition] == {"c1", "c2"}
    assert by_partition[slurm_cluster.gpu_partition] == {"g1", "g2"}


def test_two_node_job_runs_as_submitter_on_distinct_hosts(
    two_node_job: tuple[str, str], slurm_cluster: DevClusterInfo
) -> None:
    _, output = two_node_job
    per_task: dict[str, list[str]] = {}
    for line in output.splitlines():
        task, _, value = line.partition(": ")
        per_task.setdefault(task, []).append(value.strip())
    assert sorted(per_task) == ["0", "1"], output
    users = {values[0] for values in per_task.values()}
    hostnames = {values[1] for values in per_task.values()}
    addresses = {values[2] for values in per_task.values()}
    assert users == {slurm_cluster.user}
    assert slurm_cluster.user != "root"
    assert len(hostnames) == 2, output
    assert len(addresses) == 2, output
    assert all(addr.startswith("127.0.1.") for addr in addresses), output


def test_each_node_has_its_own_tmp_and_pids_and_all_share_the_state_dir(
    ssh: paramiko.SSHClient, job_dir: str, slurm_cluster: DevClusterInfo
) -> None:
    marker = f"/tmp/dslurm-node-tmp-{uuid.uuid4().hex}"
    steps = [
        'set -- $(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        f'srun -N1 -n1 -w "$1" touch {marker}',
        f'srun -N1 -n1 -w "$1" sh -c "test -e {marker} && echo first:present || echo first:absent"',
        f'srun -N1 -n1 -w "$2" sh -c "test -e {marker} && echo second:present || echo second:absent"',
        f'srun -N1 -n1 -w "$2" sh -c "test -S {slurm_cluster.state_dir}/run/munge.sock && echo second:state"',
        f'echo "batch:$(hostname):$(test -e {marker} && echo present || echo absent)"',
        'srun -N1 -n1 -w "$2" sh -c "echo second:init=\\$(cat /proc/1/comm)"',
    ]
    _, output = _sbatch_wait(
        ssh, job_dir, f"--partition={slurm_cluster.partition}", "--nodes=2",
        "--ntasks-per-node=1", wrap="; ".join(steps),
    )
    lines = output.split()
    assert "first:present" in lines and "second:absent" in lines, output
    assert "second:state" in lines, output  # the state dir (below /tmp) is shared
    assert "batch:c1:present" in lines, output  # the batch step runs on the first node
    assert "second:init=slurmd" in lines, output  # each node has its own PID namespace
    login = _ssh_run(ssh, ["sh", "-c", f"hostname; test -e {marker} && echo present || echo absent"])
    assert login.split() == ["login", "absent"], login
    assert not Path(marker).exists(), "a node wrote into the host's /tmp"
    assert (slurm_cluster.node_tmp("c1") / marker.removeprefix("/tmp/")).exists()
    (slurm_cluster.node_tmp("c1") / marker.removeprefix("/tmp/")).unlink()


def test_gpu_job_sees_two_devices(
    ssh: paramiko.SSHClient, job_dir: str, slurm_cluster: DevClusterInfo
) -> None:
    _, output = _sbatch_wait(
        ssh,
        job_dir,
        f"--partition={slurm_cluster.gpu_partition}",
        "--gres=gpu:2",
        wrap='echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"',
    )
    assert output.strip() == "CUDA_VISIBLE_DEVICES=0,1"


def test_sacct_reports_finished_job(ssh: paramiko.SSHClient, two_node_job: tuple[str, str]) -> None:
    job_id, _ = two_node_job
    deadline = time.monotonic() + 15
    state = ""
    while state != "COMPLETED" and time.monotonic() < deadline:
        out = _ssh_run(ssh, ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"])
        state = out.strip()
        time.sleep(0.5)
    assert state == "COMPLETED"


def test_second_up_starts_nothing(slurm_cluster: DevClusterInfo) -> None:
    cluster = DevCluster(state_dir=slurm_cluster.state_dir)
    before = {d.name: d.pid for d in cluster.status().daemons}
    info = cluster.up()
    after = cluster.status()
    assert after.ok
    assert {d.name: d.pid for d in after.daemons} == before
    assert info == slurm_cluster


def test_cli_env_and_status(
    slurm_cluster: DevClusterInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = str(slurm_cluster.state_dir)
    assert main(["dev-cluster", "status", "--state-dir", state_dir]) == 0
    capsys.readouterr()
    assert main(["dev-cluster", "env", "--state-dir", state_dir]) == 0
    lines = capsys.readouterr().out.splitlines()
    exported = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    assert exported["SLURM_EDGE_NODE_HOST"] == "127.0.0.1"
    assert exported["SLURM_EDGE_NODE_PORT"] == str(slurm_cluster.port)
    assert exported["SLURM_PARTITION"] == "cpu"
    assert exported["SLURM_GPU_PARTITION"] == "gpu"
    assert shlex.split(exported["SLURM_CONF"]) == [str(slurm_cluster.slurm_conf)]
