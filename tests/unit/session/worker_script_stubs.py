"""A worker allocation's batch script run with bash and stub Slurm, Ray and python3
commands (no tests here).

The stubs stand in for the cluster: ``srun`` runs the node's shell locally, ``ray start``
prints Ray's start line and sleeps (its pid names the Ray node: ``id<pid>``), ``python3``
answers the script's node query from the stubs' files, ``squeue`` reports the head's job
state from a file. The head's GCS port is a real listening socket. Used by
``test_session_worker_script.py`` and ``test_worker_script_hosts_head.py``.
"""

from __future__ import annotations

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

from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.workers.job_script import render_worker

BASH = "/bin/bash"
#: The worker allocation's job id (``SLURM_JOB_ID``).
JOB_ID = "42"
#: Seconds :func:`wait_for` and :meth:`Worker.exit_code` wait at most: generous, as the unit
#: tests run at a lower CPU priority beside the integration tests (a passing wait returns at once).
DEADLINE = 60.0
#: The script's pace, shortened through its environment (see the template's pace): a round
#: every 0.1 s instead of 1 s, the head's port every second instead of every 5 s, the node
#: query at every round instead of every 2 s, a drain's round every 0.1 s instead of 2 s.
PACE = {"__DS_DW_ROUND": "0.1", "__DS_DW_LIVE_EVERY": "1", "__DS_DW_IDS_EVERY": "0",
        "__DS_DW_DRAIN_ROUND": "0.1"}

#: The stub commands by name (first on ``PATH``, before /usr/bin and /bin).
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
    """The running batch script (``proc``) of worker allocation :data:`JOB_ID` under
    ``root``, its session ``paths`` and the stubs' directory (which holds their records)."""

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

    def joined(self, head: str) -> str:
        """The Ray node id of node ``n1`` once it joined head job ``head`` ('' until then)."""
        rows = self.ray_nodes()
        return rows[0][1] if rows and rows[0][0] == "n1" and rows[0][2] == head else ""

    def exit_code(self) -> int:
        return self.proc.wait(DEADLINE)


def wait_for(predicate, what: str, timeout: float = DEADLINE):  # noqa: ANN001, ANN201
    """Poll ``predicate`` until it is truthy and return its value; fail after ``timeout``
    seconds naming ``what``."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def worker_config(**kwargs: object) -> SlurmWorkerAllocationConfig:
    """One ``gpu`` node with 2 CPUs and 2 GPUs for 10 minutes, an extra Ray resource and
    ``--num-cpus=8``; ``kwargs`` override any field."""
    values: dict = {"partition": "gpu", "num_nodes": 1, "cpus_per_task": 2,
                    "gpus_per_node": 2, "time_limit": "00:10:00",
                    "ray_resources": {"accelerator:a40": 1}, "ray_start_args": ["--num-cpus=8"]}
    values.update(kwargs)
    return SlurmWorkerAllocationConfig(**values)


@contextmanager
def worker(tmp_path: Path, config: SlurmWorkerAllocationConfig | None = None,
           restart_delays: tuple[int, ...] = (1, 1, 1)) -> Iterator[Worker]:
    """Render the worker script for ``config`` (None: :func:`worker_config`) and run it
    with the stubs under ``tmp_path``, the head's job RUNNING; kills it and what it
    started on exit."""
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
    text = render_worker(paths=paths, launcher=launcher, config=config or worker_config(),
                         activation=None, token="tok", restart_delays=restart_delays)
    script = tmp_path / "worker.sh"
    script.write_text(text)
    Path(paths.submit_dir("tok")).mkdir(parents=True)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG_DIR": str(stubs),
           "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "2",
           "SLURMD_NODENAME": "n1", "HOME": str(tmp_path), **PACE}
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


