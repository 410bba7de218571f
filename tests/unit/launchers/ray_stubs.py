"""Stub cluster commands for running Ray job scripts with bash (no tests here).

Used by ``test_ray_script.py``, ``test_ray_head_only.py`` and ``test_ray_privacy.py``.

The stubs record their arguments under ``<tmp>/log``. PATH holds only the stubs and
symlinks to the few real tools the script may use, so a script that calls anything else
fails here. The stub ``ray start`` listens on its GCS port (head), prints Ray's
"Ray runtime started." line, and blocks until SIGTERM, like the real one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.ray_ports import RayPortConfig

URG, WINCH = int(signal.SIGURG), int(signal.SIGWINCH)
"""The stop signals, as the job script passes them to scancel: by number."""

TOOLS = (
    "bash",
    "sleep",
    "tail",
    "mkdir",
    "rm",
    "mv",
    "getconf",
    "timeout",
    "setsid",
    "cat",
    "true",
)

STUB_RAY = """\
import json, os, signal, socket, sys, time
args = sys.argv[1:]
host = os.environ.get("STUB_HOST", "local")
log = os.environ["STUB_LOG"]
with open(os.path.join(log, "ray." + host + ".argv"), "a") as f:
    f.write(json.dumps(args) + "\\n")
with open(os.path.join(log, "ray." + host + ".pid"), "w") as f:
    f.write(str(os.getpid()))
opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
logs = os.path.join(opts["temp-dir"], "session_latest", "logs")
os.makedirs(logs, exist_ok=True)
with open(os.path.join(logs, "raylet.out"), "w") as f:
    f.write("raylet log of " + host + "\\n")
if host in os.environ.get("STUB_RAY_FAIL", "").split():
    print("RuntimeError: stub ray cannot start on " + host, flush=True)
    sys.exit(1)
if host in os.environ.get("STUB_RAY_STRAGGLER", "").split():
    # a Ray process that outlives 'ray start', ignoring TERM and HUP, writing to the temp dir
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        while True:
            try:
                os.makedirs(logs, exist_ok=True)
                with open(os.path.join(logs, "straggler.out"), "a") as f:
                    f.write("still here\\n")
            except OSError:
                pass
            time.sleep(0.02)
    with open(os.path.join(log, "straggler." + host + ".pid"), "w") as f:
        f.write(str(child))
def stop(signum, frame):
    open(os.path.join(log, "ray." + host + ".stopped"), "w").close()
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
server = None
if "--head" in args:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(opts["port"])))
    server.listen()
print("Local node IP: " + opts["node-ip-address"], flush=True)
if host not in os.environ.get("STUB_RAY_HANG", "").split():
    time.sleep(0.1)
    print("Ray runtime started.", flush=True)
while True:
    time.sleep(0.5)
"""

STUB_SRUN = """\
#!/bin/bash
printf '%s\\0' "$@" >> "$STUB_LOG/srun.fullargv"
host="" step="" seen=""
while [ $# -gt 0 ]; do
    case $1 in
        --nodelist=*) host=${1#*=} ;;
        --job-name=*) step=${1##*-} ;;
        --*) ;;
        *) break ;;
    esac
    seen="$seen $1"
    shift
done
printf '%s\\n' "${seen# } $1" >> "$STUB_LOG/srun.argv"
printf '%s\\n' "$$" > "$STUB_LOG/step.$step.pid"
export STUB_HOST=$host SLURM_STEP_ID=$step SLURMD_NODENAME=$host
exec "$@"
"""

STUB_SCANCEL = """\
#!/bin/bash
printf '%s\\n' "$*" >> "$STUB_LOG/scancel.argv"
sig=KILL step=""
for arg in "$@"; do
    case $arg in
        --signal=*) sig=${arg#*=} ;;
        *.*) step=${arg#*.} ;;
    esac
done
[ -n "$step" ] && kill -s "$sig" "$(cat "$STUB_LOG/step.$step.pid")"
"""

STUB_SCONTROL = """\
#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 2
printf '%s\\n' $STUB_HOSTS
"""

STUB_HOSTNAME = """\
#!/bin/bash
host=${STUB_HOST:-c1}
if [ "${1-}" = -i ]; then
    printf '127.0.1.%s\\n' "${host#c}"
else
    printf '%s\\n' "$host"
fi
"""

STUB_SS = """\
#!/bin/bash
# The host's real listeners (when ss exists), plus the ones a test pretends.
if [ -n "$REAL_SS" ]; then
    "$REAL_SS" "$@"
else
    printf 'State Recv-Q Send-Q Local Address:Port Peer Address:Port\\n'
fi
for port in $STUB_SS_PORTS; do
    printf 'LISTEN 0 128 127.0.0.1:%s 0.0.0.0:*\\n' "$port"
done
"""


@dataclass
class StubCluster:
    """A temporary directory with stub commands, a job directory and the stubs' records."""

    root: Path
    bin: Path
    log: Path
    job: Path
    locks: Path
    job_id: str
    env: dict[str, str] = field(default_factory=dict)
    #: The port range of :meth:`launcher` (first and last port): each test module has one of
    #: its own (see ``create``).
    ports: tuple[int, int] = (31000, 31499)

    @classmethod
    def create(cls, root: Path, *, flock: bool = True, ss: bool = True,
               ports: tuple[int, int] = (31000, 31499)) -> StubCluster:
        """``ports``: the range the stub Ray heads listen in. Real Ray heads take their
        blocks from 10000-29999 and the kernel hands out 32768 and up; the test modules
        take ranges of their own from 30000-32767, so that pytest-xdist can run two
        modules at once (it runs the tests of one module on one worker, one at a time)."""
        bin_dir, log, job, locks = (root / "bin", root / "log", root / "job", root / "locks")
        for directory in (bin_dir, log, job, locks):
            directory.mkdir()
        tools = list(TOOLS) + (["flock"] if flock else [])
        for tool in tools:
            found = shutil.which(tool)
            assert found, f"{tool} is needed for these tests"
            (bin_dir / tool).symlink_to(found)
        stubs = {
            "srun": STUB_SRUN,
            "scancel": STUB_SCANCEL,
            "scontrol": STUB_SCONTROL,
            "hostname": STUB_HOSTNAME,
            "ray": f"#!{sys.executable}\n{STUB_RAY}",
        }
        if ss:
            stubs["ss"] = STUB_SS
        for name, text in stubs.items():
            path = bin_dir / name
            path.write_text(text)
            path.chmod(0o755)
        job_id = str(random.randrange(10**6, 10**7))
        env = {
            "PATH": str(bin_dir),
            "LC_ALL": "C",
            "STUB_LOG": str(log),
            "STUB_HOSTS": "c1 c2",
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NODELIST": "c[1-2]",
            "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
            "SLURMD_NODENAME": "c1",
            "SLURM_CPUS_ON_NODE": "2",
            "REAL_SS": shutil.which("ss") or "",
        }
        return cls(root, bin_dir, log, job, locks, job_id, env, ports)

    def plan(self, payload: tuple[str, ...], mode: str = "slurm") -> ExecutionPlan:
        return ExecutionPlan(
            payload=payload,
            job_dir=str(self.job),
            status_file=str(self.job / "status"),
            drain_file=str(self.job / "drained"),
            pid_file=str(self.job / "payload.pid"),
            mode=mode,  # type: ignore[arg-type]
            num_nodes=2,
        )

    def launcher(self, **values: object) -> RayLauncher:
        values.setdefault(
            "port_config",
            RayPortConfig(range_start=self.ports[0], range_end=self.ports[1], block_size=100,
                          lock_dir=str(self.locks)),
        )
        return RayLauncher(**values)  # type: ignore[arg-type]

    def write(self, launcher: RayLauncher, plan: ExecutionPlan) -> Path:
        script = self.root / "job.sh"
        script.write_text(launcher.render(plan))
        return script

    def start(self, script: Path, **env: str) -> subprocess.Popen[str]:
        # Each run stands for a new job with the stub's id: an earlier run's start marker
        # would make the script take it for a second start of the same job and refuse.
        for marker in self.job.glob("*.started-*"):
            marker.unlink()
        return subprocess.Popen(
            ["bash", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **env},
            start_new_session=True,
        )

    def run(
        self, script: Path, timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        proc = self.start(script, **env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"script did not finish in {timeout} s\n{out}\n{err}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def ray_argv(self, host: str) -> list[str]:
        lines = (self.log / f"ray.{host}.argv").read_text().splitlines()
        assert len(lines) == 1
        return json.loads(lines[0])

    def lines(self, name: str) -> list[str]:
        path = self.log / name
        return path.read_text().splitlines() if path.exists() else []

    def ray_alive(self, wait: float = 5.0) -> list[str]:
        """Stub Ray processes still running after up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            alive = []
            for pid_file in self.log.glob("ray.*.pid"):
                try:
                    os.kill(int(pid_file.read_text()), 0)
                except ProcessLookupError:
                    continue
                alive.append(pid_file.name)
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.05)


def options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


ENV_PAYLOAD = ("bash", "-c", 'printf "%s\\n" "RAY_ADDRESS=$RAY_ADDRESS" "PWD=$PWD"')


def kill_stub_processes(stub: StubCluster) -> None:
    """Kill whatever a failed test left running (stub Ray nodes, node shells)."""
    shutil.rmtree(f"/tmp/dsr-test-{stub.job_id}", ignore_errors=True)
    for pid_file in stub.log.glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
