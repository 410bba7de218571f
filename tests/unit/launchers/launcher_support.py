"""Shared code for tests that run generated job scripts with bash in a temporary directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagster_slurm.launchers import BashLauncher, ExecutionPlan

BASH = "/bin/bash"
PYTHON = sys.executable
RUN_TIMEOUT = 15.0

# A payload that installs handlers for the signals it may get, announces that it is ready
# (writing its process-group id), then sleeps; a handled signal is written to "got" and
# the payload exits with the code given as second argument.
SIGNAL_PAYLOAD = """\
import os, signal, sys, time
out, code = sys.argv[1], int(sys.argv[2])
def handler(signum, frame):
    with open(os.path.join(out, "got"), "a") as f:
        f.write(signal.Signals(signum).name[3:] + "\\n")
    sys.exit(code)
for name in sys.argv[3:]:
    signal.signal(getattr(signal, "SIG" + name), handler)
with open(os.path.join(out, "ready.tmp"), "w") as f:
    f.write(str(os.getpgrp()))
os.rename(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))
time.sleep(30)
sys.exit(99)
"""


@dataclass(frozen=True)
class JobFiles:
    """Where one test job lives."""

    job_dir: Path
    status_file: Path
    drain_file: Path
    pid_file: Path
    script: Path

    @classmethod
    def under(cls, root: Path, name: str = "job") -> JobFiles:
        job_dir = root / name
        job_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            job_dir=job_dir,
            status_file=job_dir / "status",
            drain_file=job_dir / "drained",
            pid_file=job_dir / "payload.pid",
            script=job_dir / "job.sh",
        )

    def plan(self, payload: Sequence[str], **overrides: object) -> ExecutionPlan:
        values: dict[str, object] = {
            "payload": tuple(payload),
            "job_dir": str(self.job_dir),
            "status_file": str(self.status_file),
            "drain_file": str(self.drain_file),
            "pid_file": str(self.pid_file),
            "mode": "local",
        }
        values.update(overrides)
        return ExecutionPlan(**values)  # type: ignore[arg-type]

    def write(self, plan: ExecutionPlan, launcher: BashLauncher | None = None) -> Path:
        self.script.write_text((launcher or BashLauncher()).render(plan))
        return self.script

    def status(self) -> int | None:
        if not self.status_file.exists():
            return None
        return int(self.status_file.read_text())

    def drained(self) -> str | None:
        if not self.drain_file.exists():
            return None
        return self.drain_file.read_text().strip()


def script_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A small, predictable environment for the script."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    env.update(extra or {})
    return env


def run_script(
    script: Path, *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with bash to the end."""
    return subprocess.run(
        [BASH, str(script)],
        capture_output=True,
        text=True,
        env=script_env(env),
        timeout=RUN_TIMEOUT,
        check=False,
    )


def start_script(script: Path, *, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``script`` with bash as leader of a new POSIX session (as a local-mode caller does)."""
    return subprocess.Popen(
        [BASH, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(env),
        start_new_session=True,
    )


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited: a zombie (exited, its parent has not
    reaped it yet, as when the stub srun that started it was stopped first, or when it was
    orphaned) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def wait_for_file(path: Path, timeout: float = RUN_TIMEOUT) -> str:
    """The content of ``path`` once it exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)
    return path.read_text()


def kill_leftovers(files: JobFiles) -> None:
    """Kill the payload's process group if a failed test left it running."""
    if not files.pid_file.exists():
        return
    text = files.pid_file.read_text().strip()
    if text.isdigit():
        try:
            os.killpg(int(text), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
