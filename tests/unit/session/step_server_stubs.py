"""Stub Slurm commands (srun, scontrol, scancel), a handle on a step server run with bash, and
``step_server``, which runs one at the shorter pace of the tests (no tests here).

The stubs record their arguments under ``$STUB_LOG_DIR``; ``srun`` runs what follows the
word ``bash`` as a numbered step and ``scancel --signal`` signals that step's process, as
Slurm signals a step's tasks. Used by ``test_session_server.py``,
``test_step_server_heartbeat.py`` and ``test_session_standby.py``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from dagster_slurm.agent.remote.files import wake_fifo
from dagster_slurm.jobs.paths import InvocationPaths
from dagster_slurm.session.core.allocation import parse_ready
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.step_server import render_server

BASH = "/bin/bash"
#: The allocation's job id (``SLURM_JOB_ID``).
JOB_ID = "42"
#: Seconds :func:`wait_for` waits by default: generous, as the unit tests run at a lower CPU
#: priority beside the integration tests (a passing wait returns at once).
DEADLINE = 30.0

# srun: ignore the options, record argv and pid, number the step (SLURM_STEP_ID, its pid in
# steps/<id>), run what follows the word 'bash'.
STUB_SRUN = """#!/bin/bash
printf '%s\\n' "$*" >> "$STUB_LOG_DIR/srun.args"
printf '%s\\n' "$$" >> "$STUB_LOG_DIR/srun.pids"
mkdir -p "$STUB_LOG_DIR/steps"
export SLURM_STEP_ID=$(ls "$STUB_LOG_DIR/steps" | wc -l)
printf '%s\\n' "$$" > "$STUB_LOG_DIR/steps/$SLURM_STEP_ID"
while [ "$#" -gt 0 ] && [ "$1" != bash ]; do shift; done
exec "$@"
"""
STUB_SCONTROL = """#!/bin/bash
if [ "$1" = show ] && [ "$2" = hostnames ]; then
    printf '%s\\n' "${3//,/$'\\n'}"
    exit 0
fi
exit 1
"""
# scancel: record argv; --signal=SIG <job>.<step> signals that step's process (as Slurm
# signals a step's tasks).
STUB_SCANCEL = """#!/bin/bash
printf '%s\\n' "$*" >> "$STUB_LOG_DIR/scancel.args"
case $1 in
    --signal=*)
        pid=$(cat "$STUB_LOG_DIR/steps/${2#*.}" 2>/dev/null) || exit 1
        kill -s "${1#--signal=}" "$pid"
        ;;
esac
"""


def install_stubs(directory: Path) -> None:
    """Write the stub ``srun``, ``scontrol`` and ``scancel`` into ``directory``
    (executable)."""
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL),
                       ("scancel", STUB_SCANCEL)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)


def wait_for(predicate: Callable[[], object], timeout: float = DEADLINE,
             what: str = "condition") -> object:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def read(path: str | Path) -> str | None:
    """The file's text; None when it does not exist."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return None


@dataclass
class Server:
    """A running step server (``proc``) of job :data:`JOB_ID` under ``root``: its session
    ``paths``, the stubs' records in ``logs``, and what the agent would do to it."""

    root: Path
    paths: SessionPaths
    proc: subprocess.Popen[bytes]
    logs: Path

    @property
    def job_dir(self) -> Path:
        return Path(self.paths.job_dir(JOB_ID))

    def log(self) -> str:
        return read(self.root / "server.log") or ""

    def wait_ready(self) -> dict[str, str]:
        ready = self.paths.ready(JOB_ID)
        wait_for(lambda: os.path.exists(ready), what=f"the ready file\n{self.log()}")
        return parse_ready(Path(ready).read_text())

    def wake(self) -> tuple[bool, str]:
        """Write a line to the server's wake FIFO, as the agent does after a request."""
        return wake_fifo(self.paths.wake(JOB_ID))

    def request(self, request_id: str, body: str, *, name: str | None = None,
                lines: list[str] | None = None, record: bool = True,
                wake: bool = True) -> InvocationPaths:
        """Write a step script and request it, atomically (temp name, then rename), then
        wake the server (unless ``wake`` is False). The script records its step id after
        the body's leading ``trap`` lines, as a real step does once its signal handling is
        set up."""
        inv = self.paths.invocation(JOB_ID, name or f"step-{request_id}", "inv")
        Path(inv.job_dir).mkdir(parents=True, exist_ok=True)
        script = inv.file("dagster_slurm_step.sh")
        body_lines = body.split("\n")
        traps = 0
        while traps < len(body_lines) and body_lines[traps].startswith("trap "):
            traps += 1
        step_file = shlex.quote(inv.file("slurm_step_id"))
        if record:
            body_lines.insert(traps, f"printf '%s\\n' \"$SLURM_STEP_ID\" > {step_file}")
        Path(script).write_text("#!/bin/bash\n" + "\n".join(body_lines) + "\n")
        if lines is None:
            lines = [script, inv.stdout, inv.stderr, inv.status, inv.drain,
                     name or f"step-{request_id}", inv.file("slurm_step_id")]
        target = Path(self.paths.request(JOB_ID, request_id))
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f"{request_id}.tmp")
        temp.write_text("\n".join(lines) + "\n")
        os.rename(temp, target)
        if wake:
            self.wake()
        return inv

    def cancel(self, request_id: str) -> None:
        target = Path(self.paths.request(JOB_ID, request_id, "cancel"))
        temp = target.with_name(f"{request_id}.tmpc")
        temp.write_text("\n")
        os.rename(temp, target)
        self.wake()

    def status(self, inv: InvocationPaths) -> str:
        text = wait_for(lambda: read(inv.status),
                        what=f"the status file {inv.status}\n{self.log()}")
        return str(text).strip()

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)


#: The server's intervals, shortened through its environment (see the template's pace):
#: the idle wait (ms), the heartbeat check's period and the KILL after TERM (whole seconds),
#: the Ray head watcher's probe interval (seconds). A real allocation waits 2000 ms, 2 s,
#: 10 s and 5 s (test_a_real_allocation_keeps_the_production_pace).
PACE = {"__DS_SS_IDLE_MS": "200", "__DS_SS_HEARTBEAT_EVERY": "1", "__DS_SS_KILL_AFTER": "1",
        "__DS_SS_PROBE_EVERY": "0.2"}
# A step that waits (bounded: it always ends within ~20 s) until a file appears.
WAIT_LOOP = "for _i in $(seq 200); do [ -e {flag} ] && break; sleep 0.1; done"


def gone(pid: int) -> bool:
    """The process ``pid`` has ended (it no longer exists, or is a zombie)."""
    try:
        record = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return record.rsplit(")", 1)[1].split()[0] == "Z"


def kill_our_steps(logs: Path, root: Path) -> None:
    """SIGKILL the steps our stub srun started (they run in sessions of their own)."""
    pids = read(logs / "srun.pids") or ""
    for line in pids.split():
        try:
            cmdline = Path(f"/proc/{line}/cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in cmdline:  # still our step, not a reused pid
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass


@contextmanager
def step_server(tmp_path: Path, *, heartbeat_timeout: float | None = None,
                drain_signal: str = "USR1", ray_address: str | None = "10.1.2.3:6379",
                nodelist: str = "n1", before_start: Callable[[SessionPaths], None] | None = None,
                ) -> Iterator[Server]:
    """Render the step server of job :data:`JOB_ID` under ``tmp_path`` and run it with the
    stubs at :data:`PACE`; ``before_start`` gets the session paths before it starts. Kills
    it and the steps it started on exit."""
    stubs, logs = tmp_path / "bin", tmp_path / "stub-logs"
    stubs.mkdir()
    logs.mkdir()
    install_stubs(stubs)
    paths = SessionPaths.create(str(tmp_path), "run1")
    Path(paths.session_dir).mkdir(parents=True)
    script = tmp_path / "step_server.sh"
    script.write_text(render_server(paths, "tok", drain_signal, heartbeat_timeout))
    if before_start is not None:
        before_start(paths)
    env = {
        "PATH": f"{stubs}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "LC_ALL": "C",
        "STUB_LOG_DIR": str(logs),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURMD_NODENAME": "n1",
        **PACE,
    }
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [BASH, str(script)], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = Server(tmp_path, paths, proc, logs)
    try:
        yield server
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=DEADLINE)
        kill_our_steps(logs, tmp_path)
