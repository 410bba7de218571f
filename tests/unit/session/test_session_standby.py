"""The successor's standby script, run with bash and stub Slurm commands.

A drain signal before the promotion is recorded (``jobs/<job id>/drained``) and the standby
keeps waiting; any other signal ends it as a cancellation; promotion makes the standby the
start script (the same process); a drained successor's step server, once promoted, answers
every step drained without starting it; the dead-man's switch judges the heartbeat's content.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from step_server_stubs import BASH, JOB_ID, Server, install_stubs, read, wait_for

from dagster_slurm.launchers import BashLauncher, ExecutionPlan
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.step_server import render_server
from dagster_slurm.session.head.standby import render_standby

TOKEN = "tok"
WAITING = f"successor allocation {JOB_ID} started; waiting for its promotion"


@dataclass
class Standby:
    root: Path
    paths: SessionPaths
    proc: subprocess.Popen[bytes]
    logs: Path
    drain_signal: str

    @property
    def submit_dir(self) -> Path:
        return Path(self.paths.submit_dir(TOKEN))

    @property
    def drained(self) -> Path:
        return Path(self.paths.drained(JOB_ID))

    def log(self) -> str:
        return read(self.root / "standby.log") or ""

    def wait_waiting(self) -> None:
        """Until the standby stands by (its traps are set by then)."""
        wait_for(lambda: WAITING in self.log(), what=f"the standby to wait\n{self.log()}")

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def promote(self, script_text: str) -> Path:
        """What promotion writes: the start script, then the start file naming it."""
        script = self.submit_dir / "promoted-1.sh"
        script.write_text(script_text)
        start = self.submit_dir / "start"
        start.with_name("start.tmp").write_text(f"{script}\n")
        os.rename(start.with_name("start.tmp"), start)
        return script


@contextmanager
def standby(tmp_path: Path, *, drain_signal: str = "USR1",
            heartbeat_timeout: float | None = None) -> Iterator[Standby]:
    stubs, logs = tmp_path / "bin", tmp_path / "stub-logs"
    stubs.mkdir()
    logs.mkdir()
    install_stubs(stubs)
    paths = SessionPaths.create(str(tmp_path), "run1")
    submit_dir = Path(paths.submit_dir(TOKEN))
    submit_dir.mkdir(parents=True)
    script = submit_dir / "allocation.sh"
    script.write_text(render_standby(paths, TOKEN, drain_signal, heartbeat_timeout))
    (submit_dir / "step_server.sh").write_text(render_server(paths, TOKEN, drain_signal, None))
    env = {
        "PATH": f"{stubs}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "LC_ALL": "C",
        "STUB_LOG_DIR": str(logs),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NODELIST": "n1",
        "SLURMD_NODENAME": "n1",
    }
    with open(tmp_path / "standby.log", "wb") as log:
        proc = subprocess.Popen(
            [BASH, str(script)], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield Standby(tmp_path, paths, proc, logs, drain_signal)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


def _promoted_script(box: Standby) -> str:
    """The start script promotion renders: the job prologue, then the step server."""
    submit_dir = str(box.submit_dir)
    plan = ExecutionPlan(
        payload=("bash", f"{submit_dir}/step_server.sh"), job_dir=submit_dir,
        status_file=f"{submit_dir}/exit_status", drain_file=f"{submit_dir}/drain_signal",
        mode="slurm", drain_signal=box.drain_signal,
    )
    return BashLauncher().render(plan)


# -- waiting and promotion ---------------------------------------------------------------------


def test_promotion_makes_the_standby_its_start_script_in_the_same_process(tmp_path: Path) -> None:
    with standby(tmp_path) as box:
        box.wait_waiting()
        mark = tmp_path / "started"
        box.promote(f"printf '%s\\n' \"$$\" > {mark}\nexit 7\n")
        assert box.proc.wait(timeout=10) == 7, box.log()
        assert read(mark) == f"{box.proc.pid}\n"  # exec: the batch shell's own process
        assert not box.drained.exists()


# -- signals before the promotion --------------------------------------------------------------


def test_a_drain_before_promotion_is_recorded_and_the_standby_keeps_waiting(
    tmp_path: Path,
) -> None:
    with standby(tmp_path) as box:
        box.wait_waiting()
        box.signal(signal.SIGUSR1)
        wait_for(lambda: read(box.drained) == "USR1\n", what=f"the drained file\n{box.log()}")
        assert read(box.submit_dir / "standby_drain_signal") == "USR1\n"
        box.signal(signal.SIGUSR1)  # a repeated drain changes nothing
        assert box.proc.poll() is None, box.log()
        assert "drained (USR1) before its promotion" in box.log()
        mark = tmp_path / "started"
        box.promote(f"touch {mark}\n")
        assert box.proc.wait(timeout=10) == 0, box.log()
        assert mark.exists()  # still promoted: the promotion goes ahead
        assert read(box.drained) == "USR1\n"


def test_term_is_recorded_as_the_drain_when_it_is_the_drain_signal(tmp_path: Path) -> None:
    with standby(tmp_path, drain_signal="TERM") as box:
        box.wait_waiting()
        box.signal(signal.SIGTERM)
        wait_for(lambda: read(box.drained) == "TERM\n", what=f"the drained file\n{box.log()}")
        assert box.proc.poll() is None, box.log()


def test_another_signal_before_promotion_ends_the_standby_as_cancelled(tmp_path: Path) -> None:
    with standby(tmp_path, drain_signal="USR1") as box:
        box.wait_waiting()
        box.signal(signal.SIGTERM)
        assert box.proc.wait(timeout=10) == 128 + signal.SIGTERM, box.log()
        assert read(box.submit_dir / "standby_status") == f"{128 + signal.SIGTERM}\n"
        assert not box.drained.exists()
        assert "signal TERM received before its promotion" in box.log()


def test_a_promoted_drained_successor_answers_every_step_drained(tmp_path: Path) -> None:
    with standby(tmp_path) as box:
        box.wait_waiting()
        box.signal(signal.SIGUSR1)
        wait_for(lambda: read(box.drained) == "USR1\n", what=f"the drained file\n{box.log()}")
        box.promote(_promoted_script(box))
        server = Server(box.root, box.paths, box.proc, box.logs)
        ready = server.wait_ready()
        assert ready["job_id"] == JOB_ID and ready["drained"] == "USR1"
        inv = server.request("1", "echo ran > /dev/stderr; exit 5")
        assert server.status(inv) == "0"
        assert read(inv.drain) == "USR1\n"
        assert read(inv.stderr) is None  # never started
        assert not (box.logs / "srun.args").exists()
        assert "was drained (USR1) before this server started" in box.log()
        assert box.proc.poll() is None  # the allocation stays up while drained
        box.signal(signal.SIGINT)  # the batch shell forwards it; the server leaves
        assert box.proc.wait(timeout=15) == 0, box.log()


def test_a_promoted_successor_without_a_drain_starts_its_steps(tmp_path: Path) -> None:
    with standby(tmp_path) as box:
        box.wait_waiting()
        box.promote(_promoted_script(box))
        server = Server(box.root, box.paths, box.proc, box.logs)
        assert server.wait_ready()["drained"] == ""
        inv = server.request("1", "echo ran; exit 5")
        assert server.status(inv) == "5"
        assert read(inv.stdout) == "ran\n"
        assert not box.drained.exists()
        # the server runs in a process group of its own: stop it through the batch shell
        box.signal(signal.SIGINT)
        assert box.proc.wait(timeout=15) == 0, box.log()


# -- the dead-man's switch ---------------------------------------------------------------------


def test_unchanged_heartbeat_content_cancels_the_waiting_successor(tmp_path: Path) -> None:
    with standby(tmp_path, heartbeat_timeout=1) as box:
        heartbeat = Path(box.paths.heartbeat)
        heartbeat.write_text("login 1\n")
        box.wait_waiting()
        scancel = box.logs / "scancel.args"
        wait_for(scancel.exists, timeout=15, what=f"scancel\n{box.log()}")
        assert scancel.read_text() == f"{JOB_ID}\n"
        assert read(Path(box.paths.job_dir(JOB_ID)) / "ended_by") == "heartbeat\n"
        assert "no supervisor heartbeat" in box.log() and "limit 1 s" in box.log()


def test_changing_heartbeat_content_keeps_the_successor_waiting(tmp_path: Path) -> None:
    with standby(tmp_path, heartbeat_timeout=1) as box:
        heartbeat = Path(box.paths.heartbeat)
        heartbeat.write_text("login 0\n")
        stop = threading.Event()
        beats = {"n": 0}

        def beat() -> None:
            while not stop.wait(0.3):
                beats["n"] += 1
                heartbeat.with_name("hb.tmp").write_text(f"login {beats['n']}\n")
                os.replace(heartbeat.with_name("hb.tmp"), heartbeat)

        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        try:
            box.wait_waiting()
            # more than three limits of beating (each beat a new content)
            wait_for(lambda: beats["n"] >= 12 or box.proc.poll() is not None, timeout=20,
                     what="the beats")
            assert box.proc.poll() is None, box.log()
            assert not (box.logs / "scancel.args").exists(), box.log()
        finally:
            stop.set()
            beater.join(5)
