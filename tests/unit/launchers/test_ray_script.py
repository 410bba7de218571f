"""The Ray job script run for real with bash, against stub srun/scontrol/scancel/ray/ss.

See ``ray_stubs.py`` for the stubs: they record their arguments, and PATH holds only
them and the few real tools the script may use, so a script that calls anything else
fails here.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from launcher_support import process_running
from ray_stubs import ENV_PAYLOAD, URG, WINCH, StubCluster, kill_stub_processes, options

from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.ray_ports import PORT_OFFSETS, RayPortConfig, hash_block_index
from dagster_slurm.launchers.ray_script import RAY_START_FAILED_STATUS

#: The stub Ray heads of this module listen on ports of 31000-31799 (see ray_stubs).


@pytest.fixture
def cluster(tmp_path: Path):
    stub = StubCluster.create(tmp_path)
    yield stub
    kill_stub_processes(stub)


def test_two_nodes_start_run_the_payload_and_stop(cluster: StubCluster) -> None:
    script = cluster.write(
        cluster.launcher(object_store_memory=100_000_000), cluster.plan(ENV_PAYLOAD)
    )
    result = cluster.run(script)
    assert result.returncode == 0, result.stderr
    assert (cluster.job / "status").read_text() == "0\n"
    head, worker = cluster.ray_argv("c1"), cluster.ray_argv("c2")
    head_opts, worker_opts = options(head), options(worker)
    assert head[:2] == ["start", "--block"] and "--head" in head
    assert "--head" not in worker and "--block" in worker
    assert head_opts["node-ip-address"] == "127.0.1.1"
    assert worker_opts["node-ip-address"] == "127.0.1.2"
    assert worker_opts["address"] == f"127.0.1.1:{head_opts['port']}"
    assert head_opts["resources"] == '{"dagster_slurm_head": 1}'
    assert worker_opts["resources"] == '{"dagster_slurm_worker": 1}'
    for opts, index in ((head_opts, 0), (worker_opts, 1)):
        assert opts["num-cpus"] == "2" and opts["num-gpus"] == "0"
        assert opts["temp-dir"] == f"/tmp/dsray-{cluster.job_id}-{index}"
        assert opts["object-store-memory"] == "100000000"
        assert not Path(opts["temp-dir"]).exists(), "default temp dir must be removed"
    assert "--disable-usage-stats" in head
    # Every port of a node comes from one block of the range.
    base = int(head_opts["port"])
    assert (base - 31000) % 100 == 0
    assert int(head_opts["node-manager-port"]) == base + PORT_OFFSETS["node_manager"]
    assert int(head_opts["dashboard-port"]) == base + PORT_OFFSETS["dashboard"]
    assert int(head_opts["max-worker-port"]) == base + 99
    worker_base = int(worker_opts["node-manager-port"]) - PORT_OFFSETS["node_manager"]
    assert worker_base != base, "nodes sharing a host must not share a block"
    assert f"RAY_ADDRESS=127.0.1.1:{base}" in result.stdout
    assert f"Ray head node web UI: http://127.0.1.1:{base + 3}" in result.stdout
    assert f"ssh -L 8265:127.0.1.1:{base + 3} <login-host>" in result.stdout
    srun = cluster.lines("srun.argv")
    assert len(srun) == 2
    for line, host in zip(srun, ("c1", "c2"), strict=True):
        assert line.startswith("--overlap --export=ALL --nodes=1 --ntasks=1")
        assert f"--nodelist={host}" in line and "--mem=0" in line
        assert "--cpus-per-task=2" in line
    # Stopped with SIGURG to each step (workers first), never with 'ray stop'.
    assert cluster.lines("scancel.argv") == [
        f"--quiet --signal={URG} {cluster.job_id}.1",
        f"--quiet --signal={URG} {cluster.job_id}.0",
    ]
    assert (cluster.log / "ray.c1.stopped").exists() and (cluster.log / "ray.c2.stopped").exists()
    assert cluster.ray_alive(wait=0) == []
    assert sorted(p.name for p in cluster.locks.iterdir()) == sorted(
        f"dagster-slurm-ray-port-{b}.lock" for b in (base, worker_base)
    )
    assert "[ray c2] Ray runtime started." in result.stderr
    assert (cluster.job / "ray-node-1.log").exists()


def test_worker_that_fails_to_start_fails_the_job_fast_naming_it(cluster: StubCluster) -> None:
    launcher = cluster.launcher(
        pre_start_commands=['[ "$(hostname)" = c1 ] || { echo "no GPU driver here"; exit 3; }']
    )
    script = cluster.write(launcher, cluster.plan(("bash", "-c", "touch ran")))
    started = time.monotonic()
    result = cluster.run(script)
    assert time.monotonic() - started < 15
    assert result.returncode == RAY_START_FAILED_STATUS, result.stderr
    assert (cluster.job / "status").read_text() == f"{RAY_START_FAILED_STATUS}\n"
    assert not (cluster.job / "ran").exists()
    tail = result.stderr.strip().splitlines()[-4:]
    assert "the Ray cluster did not start:" in "\n".join(tail)
    assert "node 1 (c2): exited with status 3 before joining" in result.stderr
    assert "no GPU driver here" in "\n".join(tail)
    assert cluster.lines("scancel.argv") == [f"--quiet --signal={URG} {cluster.job_id}.0"]
    assert cluster.ray_alive(wait=0) == []


def test_ray_start_failing_on_a_worker_is_reported_with_its_output(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(), cluster.plan(("true",)))
    result = cluster.run(script, STUB_RAY_FAIL="c2")
    assert result.returncode == RAY_START_FAILED_STATUS
    assert "node 1 (c2): exited with status 1 before joining" in result.stderr
    assert "stub ray cannot start on c2" in result.stderr
    assert "'ray start' ended on its own (status 1)" in result.stderr
    assert "raylet log of c2" in result.stderr.split("did not start:")[1]


def test_worker_that_never_joins_fails_at_the_startup_timeout(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(startup_timeout=3), cluster.plan(("true",)))
    started = time.monotonic()
    result = cluster.run(script, STUB_RAY_HANG="c2")
    elapsed = time.monotonic() - started
    assert result.returncode == RAY_START_FAILED_STATUS
    assert 1.5 < elapsed < 15
    assert "node 1 (c2): did not join within 3 s" in result.stderr
    assert "node 0" not in result.stderr.split("did not start:")[1]
    # The late node is told that it failed (SIGWINCH: stop and show Ray's logs), the head
    # just to stop.
    report = result.stderr.split("did not start:")[1]
    assert "raylet log of c2" in report and "raylet log of c1" not in result.stderr
    assert cluster.lines("scancel.argv") == [
        f"--quiet --signal={WINCH} {cluster.job_id}.1",
        f"--quiet --signal={URG} {cluster.job_id}.0",
    ]
    assert cluster.ray_alive(wait=0) == []


def test_head_that_fails_is_named(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(), cluster.plan(("true",)))
    result = cluster.run(script, STUB_RAY_FAIL="c1")
    assert result.returncode == RAY_START_FAILED_STATUS
    assert "node 0 (c1): exited with status 1 before its GCS answered" in result.stderr
    assert not cluster.lines("ray.c2.argv"), "no worker starts without a head"


def test_without_flock_random_falls_back_to_hash_jobid(tmp_path: Path) -> None:
    cluster = StubCluster.create(tmp_path, flock=False)
    config = RayPortConfig(
        range_start=31000, range_end=31499, block_size=100, lock_dir=str(cluster.locks)
    )
    script = cluster.write(cluster.launcher(port_config=config), cluster.plan(("true",)))
    result = cluster.run(script)
    assert result.returncode == 0, result.stderr
    assert "flock not found; port_strategy 'random' falls back to 'hash_jobid'" in result.stderr
    for host, index in (("c1", 0), ("c2", 1)):
        expected = config.block_base(hash_block_index(cluster.job_id, index, config.block_count))
        node_manager = int(options(cluster.ray_argv(host))["node-manager-port"])
        assert node_manager - PORT_OFFSETS["node_manager"] == expected
    assert list(cluster.locks.iterdir()) == []


def test_random_skips_blocks_with_listeners_and_locked_blocks(cluster: StubCluster) -> None:
    # Of five blocks, 31000 and 31400 have listeners and 31100 is locked by someone else:
    # the two nodes must end up in 31200 and 31300.
    held = cluster.locks / "dagster-slurm-ray-port-31100.lock"
    held.touch()
    with open(held) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        script = cluster.write(cluster.launcher(), cluster.plan(("true",)))
        result = cluster.run(script, STUB_SS_PORTS="31000 31003 31450")
    assert result.returncode == 0, result.stderr
    bases = sorted(
        int(options(cluster.ray_argv(host))["node-manager-port"]) - 1 for host in ("c1", "c2")
    )
    assert bases == [31200, 31300]


def test_no_free_block_fails_with_a_clear_message(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(), cluster.plan(("true",)))
    result = cluster.run(script, STUB_SS_PORTS="31001 31101 31201 31301 31401")
    assert result.returncode == RAY_START_FAILED_STATUS
    assert "no free port block in 31000-31499 (5 blocks of 100 tried" in result.stderr


def test_proc_net_tcp_is_read_when_ss_is_missing(tmp_path: Path) -> None:
    cluster = StubCluster.create(tmp_path, ss=False)
    config = RayPortConfig(
        range_start=31600, range_end=31799, block_size=100, lock_dir=str(cluster.locks)
    )
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 31650))
    listener.listen()
    try:
        launcher = cluster.launcher(port_config=config)
        script = cluster.write(launcher, cluster.plan(("true",)))
        result = cluster.run(
            script, STUB_HOSTS="c1", SLURM_JOB_NODELIST="c1", SLURM_JOB_CPUS_PER_NODE="2"
        )
    finally:
        listener.close()
    assert result.returncode == 0, result.stderr
    assert options(cluster.ray_argv("c1"))["port"] == "31700"


def test_fixed_strategy_uses_configured_ports(cluster: StubCluster) -> None:
    launcher = cluster.launcher(port_strategy="fixed", ray_port=47380, dashboard_port=47381)
    script = cluster.write(launcher, cluster.plan(ENV_PAYLOAD))
    result = cluster.run(script)
    assert result.returncode == 0, result.stderr
    head, worker = options(cluster.ray_argv("c1")), options(cluster.ray_argv("c2"))
    assert (head["port"], head["dashboard-port"], head["node-manager-port"]) == (
        "47380",
        "47381",
        "31001",
    )
    assert worker["node-manager-port"] == "31101"
    assert worker["address"] == "127.0.1.1:47380"
    assert "RAY_ADDRESS=127.0.1.1:47380" in result.stdout
    assert list(cluster.locks.iterdir()) == []


def test_explicit_settings_reach_ray_start(cluster: StubCluster) -> None:
    launcher = cluster.launcher(
        num_cpus_per_node=1,
        num_gpus_per_node=2,
        node_ip_address_command="printf '10.9.8.7\\n'",
        head_node_address="127.0.1.1",
        include_dashboard=False,
        redis_password="s3cret",
        ray_start_args=["--log-style=record", "--labels=zone=b,rack=c"],
        temp_dir=f"/tmp/dsr-test-{cluster.job_id}",
        working_dir="work dir",
    )
    (cluster.job / "work dir").mkdir()
    script = cluster.write(launcher, cluster.plan(ENV_PAYLOAD))
    result = cluster.run(script, SLURM_GPUS_ON_NODE="2")
    assert result.returncode == 0, result.stderr
    head = cluster.ray_argv("c1")
    opts = options(head)
    assert opts["node-ip-address"] == "10.9.8.7"
    assert (opts["num-cpus"], opts["num-gpus"]) == ("1", "2")
    assert opts["include-dashboard"] == "false" and "dashboard-port" not in opts
    assert opts["redis-password"] == "s3cret"
    assert head[-2:] == ["--log-style=record", "--labels=zone=b,rack=c"]
    assert options(cluster.ray_argv("c2"))["address"].startswith("127.0.1.1:")
    assert "Ray head node web UI" not in result.stdout
    assert f"PWD={cluster.job}/work dir" in result.stdout
    assert "warning" not in result.stderr


def test_gpu_request_beyond_the_grant_warns(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(num_gpus_per_node=2), cluster.plan(("true",)))
    result = cluster.run(script, SLURM_GPUS_ON_NODE="1")
    assert result.returncode == 0
    assert "num_gpus_per_node=2 but Slurm granted 1 GPU(s)" in result.stderr


def test_payload_status_is_the_jobs_status_and_ray_still_stops(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(), cluster.plan(("bash", "-c", "exit 7")))
    result = cluster.run(script)
    assert result.returncode == 7
    assert (cluster.job / "status").read_text() == "7\n"
    assert cluster.ray_alive(wait=0) == []


def test_missing_working_dir_fails_with_125(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(working_dir="nope"), cluster.plan(("true",)))
    result = cluster.run(script)
    assert result.returncode == 125
    assert "cannot enter working_dir nope" in result.stderr
    assert cluster.ray_alive(wait=0) == []


def test_temp_dir_that_grows_too_long_at_run_time_is_refused(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(), cluster.plan(("true",)))
    result = cluster.run(script, SLURM_JOB_ID="9" * 30)
    assert result.returncode == RAY_START_FAILED_STATUS
    assert "Unix socket paths allow at most 41" in result.stderr


def test_outside_an_allocation_slurm_mode_refuses(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(), cluster.plan(("true",)))
    env = {k: v for k, v in cluster.env.items() if k != "SLURM_JOB_ID"}
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == RAY_START_FAILED_STATUS
    assert "not inside a Slurm allocation" in proc.stderr


@pytest.mark.parametrize(
    ("sig", "status", "drained"),
    [(signal.SIGHUP, 128 + signal.SIGHUP, None), (signal.SIGTERM, 0, "TERM\n")],
    ids=["cancel", "drain"],
)
def test_signal_during_startup_stops_ray_and_skips_the_payload(
    cluster: StubCluster, sig: signal.Signals, status: int, drained: str | None
) -> None:
    plan = cluster.plan(("bash", "-c", "touch ran"))
    script = cluster.write(cluster.launcher(startup_timeout=30), plan)
    proc = cluster.start(script, STUB_RAY_HANG="c2")
    deadline = time.monotonic() + 20
    while not (cluster.log / "ray.c2.pid").exists():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)
    started = time.monotonic()
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert proc.returncode == status, err
    assert not (cluster.job / "ran").exists()
    drain_file = cluster.job / "drained"
    assert (drain_file.read_text() if drain_file.exists() else None) == drained
    assert cluster.ray_alive() == []


def test_drain_during_the_payload_is_forwarded_and_ray_stops(cluster: StubCluster) -> None:
    payload = textwrap.dedent("""\
        import signal, sys, time
        signal.signal(signal.SIGUSR1, lambda *a: sys.exit(0))
        open("ready", "w").close()
        time.sleep(30)
        sys.exit(9)
    """)
    plan = ExecutionPlan(
        payload=(sys.executable, "-c", payload),
        job_dir=str(cluster.job),
        status_file=str(cluster.job / "status"),
        drain_file=str(cluster.job / "drained"),
        mode="slurm",
        drain_signal="USR1",
    )
    proc = cluster.start(cluster.write(cluster.launcher(), plan))
    deadline = time.monotonic() + 20
    while not (cluster.job / "ready").exists():
        assert time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR1)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (cluster.job / "drained").read_text() == "USR1\n"
    assert cluster.ray_alive() == []


def test_local_mode_runs_one_node_without_srun(cluster: StubCluster) -> None:
    env: Mapping[str, str] = {"SLURM_JOB_ID": ""}
    script = cluster.write(
        cluster.launcher(num_cpus_per_node=3), cluster.plan(ENV_PAYLOAD, mode="local")
    )
    result = cluster.run(script, **env)
    assert result.returncode == 0, result.stderr
    opts = options(cluster.ray_argv("local"))
    assert opts["node-ip-address"] == "127.0.0.1" and opts["num-cpus"] == "3"
    assert opts["temp-dir"].startswith("/tmp/dsray-local-")
    assert "object-store-memory" not in opts
    assert f"RAY_ADDRESS=127.0.0.1:{opts['port']}" in result.stdout
    assert "ssh -L" not in result.stdout
    assert cluster.lines("srun.argv") == [] and cluster.lines("scancel.argv") == []
    assert cluster.ray_alive(wait=0) == []


def test_head_is_the_batch_host_and_cpus_follow_the_grant_per_node(cluster: StubCluster) -> None:
    script = cluster.write(cluster.launcher(), cluster.plan(("true",)))
    result = cluster.run(
        script,
        STUB_HOSTS="c1 c2 c3",
        SLURM_JOB_NODELIST="c[1-3]",
        SLURM_JOB_CPUS_PER_NODE="4,2(x2)",
        SLURMD_NODENAME="c2",
    )
    assert result.returncode == 0, result.stderr
    srun = cluster.lines("srun.argv")
    started = [line.split("--nodelist=")[1].split()[0] for line in srun]
    # The head (the batch host) starts first; workers start concurrently, in any order.
    assert started[0] == "c2" and sorted(started[1:]) == ["c1", "c3"]
    by_node = dict(zip(started, srun, strict=True))
    assert "--cpus-per-task=2" in by_node["c2"]
    assert "--cpus-per-task=4" in by_node["c1"]
    assert "--cpus-per-task=2" in by_node["c3"]
    assert "--head" in cluster.ray_argv("c2")
    assert options(cluster.ray_argv("c3"))["address"].startswith("127.0.1.2:")


def test_a_ray_process_that_outlives_ray_start_is_killed_and_the_temp_dir_removed(
        cluster: StubCluster) -> None:
    """Every Ray process of a node is in the process group of its 'ray start': once that
    has ended, what is left of the group is killed, so the node's temp dir can go."""
    script = cluster.write(cluster.launcher(), cluster.plan(ENV_PAYLOAD))
    result = cluster.run(script, STUB_RAY_STRAGGLER="c1 c2")
    assert result.returncode == 0, result.stderr
    for host, index in (("c1", 0), ("c2", 1)):
        straggler = int((cluster.log / f"straggler.{host}.pid").read_text())
        assert not _running_after(straggler), f"the straggler of {host} is still running"
        assert not Path(f"/tmp/dsray-{cluster.job_id}-{index}").exists()


def _running_after(pid: int, wait: float = 5.0) -> bool:
    """Whether ``pid`` still runs after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while process_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return process_running(pid)


def test_a_ray_function_of_the_pre_start_commands_is_what_starts_ray(cluster: StubCluster) -> None:
    """A site's wrapper defined as a shell function named ray is run (a function cannot be
    run in a process group of its own by setsid; that node then goes without one)."""
    wrapper = 'ray() { echo "ray wrapper of $(hostname)"; exec ray "$@"; }'
    script = cluster.write(cluster.launcher(pre_start_commands=[wrapper]), cluster.plan(ENV_PAYLOAD))
    result = cluster.run(script)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "ray wrapper of c1" in output and "ray wrapper of c2" in output
