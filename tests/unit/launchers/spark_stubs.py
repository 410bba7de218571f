"""Stub cluster commands for running Spark job scripts with bash (no tests here).

Used by ``test_spark_script.py``. ``srun`` runs each task of a step here, in a process
group of its own (``SLURM_NODEID`` and ``SLURM_STEP_ID`` set, output labelled with
``--label``); ``scancel --signal=S <job>.<step>`` sends S to every process group of that
step, as Slurm signals every process of a step. ``spark-class`` stands for Spark: the
master says it is alive and reports each worker that registered
(a file the worker writes), and every process blocks until SIGTERM. Calls are recorded
under ``<tmp>/log``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher_support import process_running

from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.spark import SparkLauncher

TOOLS = ("bash", "sleep", "tail", "mkdir", "rm", "mv", "getconf", "setsid", "cat", "true",
         "flock", "ss", "timeout")

STUB_SRUN = """\
import json, os, signal, subprocess, sys, threading
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
log = os.environ["STUB_LOG"]
with open(os.path.join(log, "srun.calls"), "a+") as f:
    f.seek(0)
    step = len(f.read().splitlines())
    f.write(json.dumps({"options": opts, "argv": args}) + "\\n")
tasks = int(opts.get("ntasks", "1"))
procs = []
for task in range(tasks):
    env = dict(os.environ, SLURM_STEP_ID=str(step), SLURM_NODEID=str(task),
               SLURMD_NODENAME="node%d" % (task + 1))
    procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True))
with open(os.path.join(log, "step-%d.pgids" % step), "w") as f:
    f.write(" ".join(str(p.pid) for p in procs))
def end_step(*_):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
signal.signal(signal.SIGTERM, lambda *_: (end_step(), sys.exit(143)))
def relay(task, stream):
    for raw in stream:
        line = raw.decode(errors="replace")
        sys.stdout.write(("%d: " % task if "label" in opts else "") + line)
        sys.stdout.flush()
threads = [threading.Thread(target=relay, args=(i, p.stdout)) for i, p in enumerate(procs)]
for t in threads:
    t.start()
codes = []
for p in procs:
    codes.append(p.wait())
    if codes[-1] != 0 and "kill-on-bad-exit" in opts:
        end_step()
for t in threads:
    t.join()
sys.exit(next((c for c in codes if c != 0), 0))
"""

STUB_SCANCEL = """\
import json, os, signal, sys
log = os.environ["STUB_LOG"]
with open(os.path.join(log, "scancel.calls"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sig = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--signal="))
step = sys.argv[-1].split(".")[1]
with open(os.path.join(log, "step-%s.pgids" % step)) as f:
    for pgid in f.read().split():
        try:
            os.killpg(int(pgid), getattr(signal, "SIG" + sig))
        except ProcessLookupError:
            pass
"""

STUB_SPARK_CLASS = """\
import json, os, signal, sys, time
args = sys.argv[1:]
log = os.environ["STUB_LOG"]
role = "master" if args[0].endswith("Master") else "worker"
opts = dict(zip(args[1::2], args[2::2]))
node = os.environ.get("SLURMD_NODENAME", "local")
with open(os.path.join(log, "%s.%s.json" % (role, node)), "w") as f:
    json.dump({"argv": args, "pid": os.getpid(),
               "local_dirs": os.environ.get("SPARK_LOCAL_DIRS", ""),
               "daemon_opts": os.environ.get("SPARK_DAEMON_JAVA_OPTS", "")}, f)
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
if role in os.environ.get("STUB_SPARK_FAIL", "").split():
    print("Exception in thread main: stub %s cannot start" % role, flush=True)
    sys.exit(1)
registry = os.path.join(log, "registered")
os.makedirs(registry, exist_ok=True)
if role == "master":
    print("INFO Master: I have been elected leader! New state: ALIVE", flush=True)
elif not os.environ.get("STUB_SPARK_SILENT"):
    with open(os.path.join(registry, node), "w") as f:
        f.write(opts["--cores"])
seen = set()
while not stopped:
    if role == "master":
        for name in sorted(set(os.listdir(registry)) - seen):
            seen.add(name)
            print("INFO Master: Registering worker %s with cores" % name, flush=True)
    time.sleep(0.05)
with open(os.path.join(log, "%s.%s.stopped" % (role, node)), "w") as f:
    f.write("TERM")
"""

STUB_HOSTNAME = """\
import sys
print("127.0.0.1" if sys.argv[1:] == ["-i"] else "stubhost")
"""


@dataclass
class SparkStubRun:
    """The outcome of one script run."""

    returncode: int
    stdout: str
    stderr: str
    job_dir: Path
    log: Path

    def status(self) -> str:
        return (self.job_dir / "exit_status").read_text().strip()

    def srun_calls(self) -> list[dict]:
        import json

        path = self.log / "srun.calls"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def record(self, role: str, node: str) -> dict:
        import json

        return json.loads((self.log / f"{role}.{node}.json").read_text())

    def alive_stub_pids(self) -> list[int]:
        pids = []
        for path in self.log.glob("*.json"):
            import json

            pid = json.loads(path.read_text())["pid"]
            if process_running(pid):
                pids.append(pid)
        return pids


def _write(path: Path, text: str) -> None:
    path.write_text(f"#!{sys.executable}\n" + text)
    path.chmod(0o755)


def stub_tree(tmp: Path) -> tuple[Path, Path, Path]:
    """Create the stub bin directory, SPARK_HOME and log directory under ``tmp``."""
    bin_dir, home, log = tmp / "bin", tmp / "spark", tmp / "log"
    for directory in (bin_dir, home / "bin", log):
        directory.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    _write(bin_dir / "srun", STUB_SRUN)
    _write(bin_dir / "scancel", STUB_SCANCEL)
    _write(bin_dir / "hostname", STUB_HOSTNAME)
    _write(home / "bin" / "spark-class", STUB_SPARK_CLASS)
    return bin_dir, home, log


def run_spark_script(tmp: Path, launcher_fields: dict, payload: tuple[str, ...], *,
                     mode: str = "slurm", nodes: int = 2, env: dict | None = None,
                     timeout: float = 60, on_start=None) -> SparkStubRun:  # noqa: ANN001
    """Render a SparkLauncher script for ``payload`` and run it with the stubs on PATH.

    ``on_start(process, run)``, when given, is called right after the script started."""
    bin_dir, home, log = stub_tree(tmp)
    job_dir = tmp / "job"
    job_dir.mkdir()
    fields = {"spark_home": str(home), "port_config": {"lock_dir": str(tmp)}, **launcher_fields}
    plan = ExecutionPlan(payload=payload, job_dir=str(job_dir),
                         status_file=str(job_dir / "exit_status"),
                         drain_file=str(job_dir / "drain_signal"), mode=mode)
    script = tmp / "job.sh"
    script.write_text(SparkLauncher(**fields).render(plan))
    environ = {"PATH": str(bin_dir), "STUB_LOG": str(log), "HOME": str(tmp)}
    if mode == "slurm":
        environ.update(SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES=str(nodes),
                       SLURM_JOB_NODELIST=f"node[1-{nodes}]", SLURMD_NODENAME="node1",
                       SLURM_JOB_CPUS_PER_NODE=f"2(x{nodes})", SLURM_CPUS_ON_NODE="2",
                       SLURM_MEM_PER_NODE="2500")
    environ.update(env or {})
    process = subprocess.Popen([shutil.which("bash") or "bash", str(script)], env=environ,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    run = SparkStubRun(-1, "", "", job_dir, log)
    if on_start is not None:
        on_start(process, run)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    run.returncode, run.stdout, run.stderr = process.returncode, out, err
    return run
