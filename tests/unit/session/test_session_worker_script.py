"""A worker allocation's batch script, run with bash and stub Slurm, Ray and python3 commands.

The stubs stand in for the cluster: ``srun`` runs the node's shell locally, ``ray start``
prints Ray's start line and sleeps (its pid names the Ray node: ``id<pid>``), ``python3``
answers the script's node query from the stubs' files, ``squeue`` reports the head's job
state from a file. The head's GCS port is a real listening socket. Real Ray on real Slurm is
tested in ``tests/integration/test_worker_allocations.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.workers.job_script import render_worker

BASH = "/bin/bash"
JOB_ID = "42"
DEADLINE = 20.0

STUBS = {
    "srun": """#!/bin/bash
printf '%s\\n' "$*" >> "$STUB_LOG_DIR/srun.args"
[ -z "${__DS_RAY_REDIS_PASSWORD-}" ] || echo yes > "$STUB_LOG_DIR/srun.password_in_env"
mkdir -p "$STUB_LOG_DIR/steps"
export SLURM_STEP_ID=$(ls "$STUB_LOG_DIR/steps" | wc -l)
printf '%s\\n' "$$" > "$STUB_LOG_DIR/steps/$SLURM_STEP_ID"
while [ "$#" -gt 0 ] && [ "$1" != bash ]; do shift; done
exec "$@"
""",
    "scontrol": """#!/bin/bash
[ "$1" = show ] && [ "$2" = hostnames ] && printf '%s\\n' "${3//,/$'\\n'}"
""",
    "scancel": """#!/bin/bash
printf '%s\\n' "$*" >> "$STUB_LOG_DIR/scancel.args"
sig=""
for arg in "$@"; do
    case $arg in
        --signal=*) sig=${arg#--signal=} ;;
        *.*) pid=$(cat "$STUB_LOG_DIR/steps/${arg#*.}" 2>/dev/null) && kill -s "$sig" "$pid" ;;
    esac
done
exit 0
""",
    "squeue": """#!/bin/bash
cat "$STUB_LOG_DIR/head_state" 2>/dev/null
""",
    "ray": """#!/bin/bash
if [ "$1" = start ]; then
    mkdir -p "$STUB_LOG_DIR/rays"
    printf '%s\\n' "$@" > "$STUB_LOG_DIR/rays/$$"
    printf '%s\\n' "$$" > "$STUB_LOG_DIR/ray.pid"
    echo "Ray runtime started."
    exec sleep 1000
fi
printf '%s\\n' "$@" > "$STUB_LOG_DIR/ray.$1"
""",
    # python3 -c <query> ids <gcs> <item>...: the latest 'ray start' is the node of the item;
    # states <gcs> <id>...: gone once the test wrote 'idle'.
    "python3": """#!/bin/bash
shift 2
mode=$1 && shift 2
for item in "$@"; do
    if [ "$mode" = ids ]; then
        printf '%s id%s\\n' "$item" "$(cat "$STUB_LOG_DIR/ray.pid")"
    elif [ -e "$STUB_LOG_DIR/idle" ]; then
        printf '%s gone\\n' "$item"
    else
        printf '%s alive\\n' "$item"
    fi
done
""",
}


@dataclass
class Worker:
    root: Path
    paths: SessionPaths
    proc: subprocess.Popen[bytes]
    stubs: Path
    head_socket: socket.socket | None = None

    def file(self, name: str) -> str:
        try:
            return (Path(self.paths.job_dir(JOB_ID)) / name).read_text()
        except FileNotFoundError:
            return ""

    def state(self) -> str:
        return self.file("state").strip()

    def ray_nodes(self) -> list[list[str]]:
        return [line.split() for line in self.file("ray_nodes").splitlines()]

    def log(self) -> str:
        return (self.root / "worker.log").read_text()

    def ray_args(self) -> list[str]:
        pid = (self.stubs / "ray.pid").read_text().strip()
        return (self.stubs / "rays" / pid).read_text().splitlines()

    def ray_pid(self) -> int:
        return int((self.stubs / "ray.pid").read_text())

    def name_head(self, job: str) -> int:
        """Open a GCS port and write ``ray_head`` naming head ``job`` there; its port."""
        if self.head_socket is not None:
            self.head_socket.close()
        self.head_socket = socket.socket()
        self.head_socket.bind(("127.0.0.1", 0))
        self.head_socket.listen(16)
        port = self.head_socket.getsockname()[1]
        head = Path(self.paths.ray_head)
        head.with_suffix(".tmp").write_text(
            f"job_id={job}\nray_address=127.0.0.1:{port}\nhost=h1\nwritten_at=1\n")
        os.replace(head.with_suffix(".tmp"), head)
        return port

    def exit_code(self) -> int:
        return self.proc.wait(DEADLINE)


def wait_for(predicate, what: str, timeout: float = DEADLINE):  # noqa: ANN001, ANN201
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _config(**kwargs: object) -> SlurmWorkerAllocationConfig:
    values: dict = {"partition": "gpu", "num_nodes": 1, "cpus_per_task": 2,
                    "gpus_per_node": 2, "time_limit": "00:10:00",
                    "ray_resources": {"accelerator:a40": 1}, "ray_start_args": ["--num-cpus=8"]}
    values.update(kwargs)
    return SlurmWorkerAllocationConfig(**values)


@contextmanager
def worker(tmp_path: Path, config: SlurmWorkerAllocationConfig | None = None,
           restart_delays: tuple[int, ...] = (1, 1, 1)) -> Iterator[Worker]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    (stubs / "head_state").write_text("RUNNING\n")
    session_dir = tmp_path / "sess ion's $(dir)"
    paths = SessionPaths(str(tmp_path), str(session_dir))
    launcher = RayLauncher(
        node_ip_address_command="echo 127.0.0.1", port_strategy="hash_jobid",
        redis_password="s3cret pw'", pre_start_commands=["export FROM_PRE_START=1"],
        ray_start_args=["--log-style=record"], temp_dir=f"/tmp/dsw-{uuid.uuid4().hex[:8]}")
    text = render_worker(paths=paths, launcher=launcher, config=config or _config(),
                         activation=None, token="tok", restart_delays=restart_delays)
    script = tmp_path / "worker.sh"
    script.write_text(text)
    Path(paths.submit_dir("tok")).mkdir(parents=True)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG_DIR": str(stubs),
           "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "2",
           "SLURMD_NODENAME": "n1", "HOME": str(tmp_path)}
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen([BASH, str(script)], env=env, stdout=log, stderr=log,
                                cwd=tmp_path, start_new_session=True)
    handle = Worker(tmp_path, paths, proc, stubs)
    try:
        yield handle
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        subprocess.run(["pkill", "-KILL", "-f", f"{stubs}/"], check=False)
        if handle.head_socket is not None:
            handle.head_socket.close()
        shutil.rmtree(launcher.temp_dir or "", ignore_errors=True)


def _joined(w: Worker, head: str) -> str:
    rows = w.ray_nodes()
    return rows[0][1] if rows and rows[0][0] == "n1" and rows[0][2] == head else ""


def test_it_waits_for_the_head_then_joins_with_its_settings(tmp_path):
    with worker(tmp_path) as w:
        wait_for(lambda: w.state() == "waiting", "the waiting state")
        assert w.file("nodes") == "n1\n"
        wait_for(lambda: "waiting for the run's Ray head" in w.log(), "the waiting line")
        port = w.name_head("7")
        node = wait_for(lambda: _joined(w, "7"), "the node to join head 7")
        assert node == f"id{w.ray_pid()}"
        wait_for(lambda: w.state() == "joined", "the joined state")
        args = w.ray_args()
        assert f"--address=127.0.0.1:{port}" in args and "--block" in args
        resources = [a for a in args if a.startswith("--resources=")]
        assert json.loads(resources[-1].split("=", 1)[1]) == {
            "accelerator:a40": 1, "dagster_slurm_worker": 1}
        assert "--num-gpus=2" in args
        cpus = [a for a in args if a.startswith("--num-cpus=")]
        assert cpus[-1] == "--num-cpus=8" and cpus[0] == "--num-cpus=2"  # SLURM_CPUS_ON_NODE
        assert args.index("--log-style=record") < args.index(resources[-1]) < args.index(cpus[-1])
        assert "--redis-password=s3cret pw'" in args
        srun = (w.stubs / "srun.args").read_text()
        assert "s3cret" not in srun and "--nodelist=n1" in srun and "--cpus-per-task=2" in srun
        assert (w.stubs / "srun.password_in_env").exists()
        w.proc.send_signal(signal.SIGTERM)
        assert w.exit_code() == 143
        assert w.state() == "released cancelled" and w.ray_nodes() == []


def test_a_node_that_ends_starts_again_then_stays_out_until_another_head(tmp_path):
    with worker(tmp_path, restart_delays=(1, 1)) as w:
        w.name_head("7")
        first = wait_for(lambda: _joined(w, "7"), "the first join")
        for restart in (1, 2):
            os.kill(w.ray_pid(), signal.SIGKILL)
            wait_for(lambda prev=first: (_joined(w, "7") or prev) != prev, f"rejoin {restart}")
            first = _joined(w, "7")
            assert f"starting it again in 1 s (restart {restart} of 2)" in w.log()
        os.kill(w.ray_pid(), signal.SIGKILL)
        wait_for(lambda: "it stays out until the allocation joins another head" in w.log(),
                 "the node to stay out")
        wait_for(lambda: w.ray_nodes() == [] and w.state() == "partial", "no joined node")
        w.name_head("8")
        wait_for(lambda: _joined(w, "8"), "the join of head 8")
        assert "the run's Ray head is now job 8" in w.log()


def test_a_new_head_moves_every_node_to_it(tmp_path):
    with worker(tmp_path) as w:
        w.name_head("7")
        old = wait_for(lambda: _joined(w, "7"), "the join of head 7")
        port = w.name_head("8")
        new = wait_for(lambda: _joined(w, "8"), "the join of head 8")
        assert new != old and f"--address=127.0.0.1:{port}" in w.ray_args()
        assert "restart" not in w.log()  # leaving a head is no strike


def test_a_drain_asks_ray_then_stops_each_idle_node_and_exits_0(tmp_path):
    with worker(tmp_path) as w:
        w.name_head("7")
        node = wait_for(lambda: _joined(w, "7"), "the join")
        deadline = int(time.time()) + 60
        Path(w.paths.worker_drain(JOB_ID)).write_text(f"deadline={deadline}\n")
        w.proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: w.state() == "draining", "the draining state")
        drain = wait_for(lambda: (w.stubs / "ray.drain-node").exists()
                         and (w.stubs / "ray.drain-node").read_text().splitlines(), "drain-node")
        assert drain[drain.index("--node-id") + 1] == node
        assert drain[drain.index("--reason") + 1] == "DRAIN_NODE_REASON_PREEMPTION"
        assert 50 <= int(drain[drain.index("--deadline-remaining-seconds") + 1]) <= 60
        assert w.proc.poll() is None  # busy: it stays until Ray reports the node idle
        (w.stubs / "idle").write_text("")
        assert w.exit_code() == 0
        assert w.state() == "released drained" and w.ray_nodes() == []
        assert "is idle and left the Ray cluster" in w.log()


def test_what_still_runs_at_the_drain_deadline_is_stopped(tmp_path):
    config = _config(signal_before_timeout="USR2@17")
    with worker(tmp_path, config) as w:
        w.name_head("7")
        wait_for(lambda: _joined(w, "7"), "the join")
        w.proc.send_signal(signal.SIGUSR2)  # the pre-walltime signal: deadline now + 17 - 15
        assert w.exit_code() == 0
        assert w.state() == "released drained"
        assert "drain deadline reached; stopping the node(s) still busy" in w.log()


def test_without_a_live_head_it_releases_itself_after_rejoin_timeout(tmp_path):
    with worker(tmp_path, _config(rejoin_timeout=7)) as w:
        w.name_head("7")
        wait_for(lambda: _joined(w, "7"), "the join")
        (w.stubs / "head_state").write_text("")  # the head's job has ended, its GCS with it
        assert w.head_socket is not None
        w.head_socket.close()
        assert w.exit_code() == 0
        assert w.state() == "released no_head" and w.ray_nodes() == []
        log = w.log()
        assert "is not live; stopping the nodes" in log and "rejoin_timeout 7 s" in log


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGHUP"])
def test_a_cancellation_while_waiting_releases_it(tmp_path, signal_name):
    with worker(tmp_path) as w:
        wait_for(lambda: w.state() == "waiting", "the waiting state")
        w.proc.send_signal(getattr(signal, signal_name))
        assert w.exit_code() == 128 + getattr(signal, signal_name)
        assert w.state() == "released cancelled"
