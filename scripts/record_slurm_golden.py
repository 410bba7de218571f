"""Record real Slurm output for the parsers' golden files from a running dev cluster.

Usage (root, with the cluster up; hold the integration-test lock on a shared machine):

    DAGSTER_SLURM_DEV_STATE_DIR=/tmp/dslurm-2411 python scripts/record_slurm_golden.py

Every command runs on the cluster's login node as the submitter, over ssh, exactly as the
library runs it (the argv come from :mod:`dagster_slurm.slurm.commands`). It submits a few
short jobs named ``golden-*`` (a running two-node job, a pending one, a GPU job, a finished
one with a job step, a cancelled one), records ``sinfo --version``, the library's
``squeue`` formats, ``sacct --parsable2``, ``scontrol show job`` and ``sbatch --test-only``
answers, then cancels its jobs. Output goes to ``tests/unit/slurm/golden/<release>/``: per
capture ``<name>.stdout``, ``<name>.stderr`` and a line in ``commands.tsv`` (name, exit
code, command); ``<release>`` is the major.minor of ``sinfo --version``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from dagster_slurm.devcluster import DevCluster
from dagster_slurm.slurm import commands
from dagster_slurm.slurm.test_only import TEST_ONLY_ENV

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "unit" / "slurm" / "golden"
JOB_NAMES = ("golden-busy", "golden-waiter", "golden-gpu", "golden-done", "golden-cancelled")
#: A payload that holds about 200 MB for 3 s in the batch step and again in an srun step,
#: so that sacct has real MaxRSS and TRES usage figures on both step lines.
MEMORY_SCRIPT = (
    "python3 -c 'import time; b = bytearray(200 * 2**20); time.sleep(3)'"
    " && srun --ntasks=1 python3 -c 'import time; b = bytearray(150 * 2**20); time.sleep(3)'"
)


class Login:
    """Runs shell command lines on the login node as the submitter."""

    def __init__(self, cluster: DevCluster) -> None:
        info = cluster.info()
        self.base = [
            "ssh", "-i", str(info.key_path), "-p", str(info.port),
            "-o", f"UserKnownHostsFile={info.known_hosts_path}", "-o", "BatchMode=yes",
            f"{info.user}@{info.host}",
        ]

    def run(self, argv: list[str], env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        prefix = [f"{name}={value}" for name, value in (env or {}).items()]
        line = shlex.join(["env", *prefix, *argv]) if prefix else shlex.join(argv)
        return subprocess.run([*self.base, line], capture_output=True, text=True, timeout=120,
                              check=False)


class Recorder:
    """Writes captures into the release's golden directory and keeps the command list."""

    def __init__(self, login: Login) -> None:
        self.login = login
        self.rows: list[str] = []
        self.directory: Path | None = None

    def start(self, release: str) -> None:
        self.directory = GOLDEN / release
        self.directory.mkdir(parents=True, exist_ok=True)

    def capture(self, name: str, argv: list[str], env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess[str]:
        proc = self.login.run(argv, env)
        assert self.directory is not None
        (self.directory / f"{name}.stdout").write_text(proc.stdout)
        (self.directory / f"{name}.stderr").write_text(proc.stderr)
        shown = shlex.join([*(f"{k}={v}" for k, v in (env or {}).items()), *argv])
        self.rows.append(f"{name}\t{proc.returncode}\t{shown}")
        return proc

    def finish(self, job_ids: dict[str, str]) -> None:
        assert self.directory is not None
        header = "name\texit_code\tcommand (run on the login node as the submitter)"
        (self.directory / "commands.tsv").write_text("\n".join([header, *self.rows]) + "\n")
        jobs = "".join(f"{name}\t{job}\n" for name, job in job_ids.items())
        (self.directory / "jobs.tsv").write_text("job_name\tjob_id\n" + jobs)


def submit(login: Login, name: str, options: list[str], wrap: str) -> str:
    argv = ["sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null", *options,
            f"--wrap={wrap}"]
    proc = login.run(argv)
    if proc.returncode != 0:
        sys.exit(f"{shlex.join(argv)} failed: {proc.stderr}")
    return proc.stdout.strip().split(";")[0]


def wait_until(login: Login, job_id: str, states: set[str], timeout: float = 90.0) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        proc = login.run(["squeue", "--noheader", "--states=all", "-j", job_id, "-o", "%T"])
        state = proc.stdout.strip()
        if state in states or (not state and "" in states):
            return state
        time.sleep(1)
    sys.exit(f"job {job_id} did not reach {states} (last: {state!r})")


def main() -> int:
    cluster = DevCluster()
    login = Login(cluster)
    version = login.run(["sinfo", "--version"])
    found = re.search(r"(\d+)\.(\d+)\.", version.stdout)
    if version.returncode != 0 or not found:
        sys.exit(f"sinfo --version failed: {version.stdout}{version.stderr}")
    recorder = Recorder(login)
    recorder.start(f"{found.group(1)}.{found.group(2)}")
    recorder.capture("sinfo_version", ["sinfo", "--version"])
    for name in JOB_NAMES:
        login.run(commands.scancel_argv(job_name=name))
    jobs: dict[str, str] = {}
    try:
        jobs["golden-done"] = submit(
            login, "golden-done", ["-p", "cpu", "--time=5", "--mem=1000M", "--comment=tok-done"],
            MEMORY_SCRIPT)
        wait_until(login, jobs["golden-done"], {"COMPLETED", "FAILED", ""})
        jobs["golden-busy"] = submit(
            login, "golden-busy",
            ["-p", "cpu", "-N", "2", "--exclusive", "--time=3", "--comment=tok-abc123"], "sleep 120")
        jobs["golden-waiter"] = submit(
            login, "golden-waiter", ["-p", "cpu", "-N", "2", "--exclusive", "--time=1", "--comment=tok-xyz"],
            "sleep 60")
        jobs["golden-gpu"] = submit(
            login, "golden-gpu", ["-p", "gpu", "--gres=gpu:2", "--time=10", "--comment=tok|with|pipes"],
            "sleep 120")
        jobs["golden-cancelled"] = submit(
            login, "golden-cancelled", ["-p", "gpu", "--time=2"], "sleep 120")
        for name in ("golden-busy", "golden-gpu", "golden-cancelled"):
            wait_until(login, jobs[name], {"RUNNING"})
        wait_until(login, jobs["golden-waiter"], {"PENDING"})
        time.sleep(2)
        login.run(commands.scancel_argv([jobs["golden-cancelled"]]))
        wait_until(login, jobs["golden-cancelled"], {"CANCELLED", ""})
        names = list(JOB_NAMES)
        recorder.capture("squeue_format", commands.squeue_argv(names))
        recorder.capture("squeue_format_ids", commands.squeue_argv(None, list(jobs.values())))
        recorder.capture("squeue_user", commands.squeue_user_argv())
        recorder.capture("squeue_observe", commands.squeue_observe_argv(names))
        recorder.capture("squeue_purged_id", ["squeue", "--noheader", "-j", "999999"])
        recorder.capture("sacct_parsable2", commands.sacct_argv(list(jobs.values())))
        for name in ("golden-busy", "golden-waiter", "golden-gpu", "golden-done"):
            short = name.removeprefix("golden-")
            recorder.capture(f"scontrol_show_job_{short}", ["scontrol", "show", "job", jobs[name]])
            recorder.capture(f"scontrol_show_job_oneliner_{short}",
                             ["scontrol", "-o", "show", "job", jobs[name]])
        test_only = {
            "test_only_runnable_idle": ["-p", "gpu", "-N", "1", "--gres=gpu:1", "--time=5"],
            "test_only_runnable_busy": ["-p", "cpu", "-N", "2", "--time=5"],
            "test_only_too_many_gpus": ["-p", "gpu", "--gres=gpu:3", "--time=5"],
            "test_only_bad_partition": ["-p", "nosuch", "--time=5"],
            "test_only_over_maxtime": ["-p", "cpu", "--time=03:00:00"],
        }
        for name, options in test_only.items():
            recorder.capture(name, ["sbatch", "--test-only", *options, "--wrap=true"],
                             dict(TEST_ONLY_ENV))
        recorder.capture("scontrol_show_config", commands.scontrol_show_config_argv())
    finally:
        if jobs:
            login.run(commands.scancel_argv(list(jobs.values())))
        recorder.finish(jobs)
    print(f"recorded {len(recorder.rows)} captures into {recorder.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
