"""The step server template, run with bash and stub Slurm commands (srun, scontrol, scancel).
Its dead-man's switch and Ray watcher: ``test_step_server_heartbeat.py``."""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from step_server_stubs import (
    BASH,
    DEADLINE,
    JOB_ID,
    PACE,
    WAIT_LOOP,
    Server,
    gone,
    read,
    step_server,
    wait_for,
)

from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.step_server import render_server

# -- the rendered script -----------------------------------------------------------------------


@pytest.mark.parametrize(("drain", "timeout"), [("USR1", None), ("TERM", 600.0), ("USR2", 5.0)])
def test_rendered_server_is_valid_bash(tmp_path: Path, drain: str, timeout: float | None) -> None:
    paths = SessionPaths.create(str(tmp_path / "a dir with 'quotes'"), "run1", "abcd1234")
    text = render_server(paths, "tok", drain, timeout)
    script = tmp_path / "server.sh"
    script.write_text(text)
    checked = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert "@@{" not in text
    assert shlex.quote(paths.session_dir) in text
    assert shlex.quote(paths.heartbeat) in text
    assert shlex.quote(paths.submit_dir("tok")) in text


def test_rendered_heartbeat_limit_is_whole_seconds_or_empty(tmp_path: Path) -> None:
    paths = SessionPaths.create(str(tmp_path), "run1")
    assert "__ss_heartbeat_timeout=600\n" in render_server(paths, "t", "USR1", 600.7)
    assert "__ss_heartbeat_timeout=''\n" in render_server(paths, "t", "USR1", None)


def test_a_real_allocation_keeps_the_production_pace(tmp_path: Path) -> None:
    # the tests' environment shortens these; a real allocation's sets none of the variables
    text = render_server(SessionPaths.create(str(tmp_path), "run1"), "t", "USR1", 600)
    for line in ("__ss_floor_ms=100", "__ss_idle_ms=2000", "__ss_heartbeat_every=2",
                 "__ss_kill_after=10", "__ss_probe_every=5"):
        assert f"\n{line}\n" in text
    for name in PACE:
        assert f'"${{{name}-}}"' in text


def test_server_refuses_to_run_outside_an_allocation(tmp_path: Path) -> None:
    paths = SessionPaths.create(str(tmp_path), "run1")
    script = tmp_path / "server.sh"
    script.write_text(render_server(paths, "tok", "USR1", None))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True,
                          timeout=DEADLINE)
    assert done.returncode != 0
    assert "inside a Slurm allocation" in done.stderr
    assert not (Path(paths.session_dir) / "jobs").exists()


# -- startup -----------------------------------------------------------------------------------


def test_server_writes_nodes_and_ready(tmp_path: Path) -> None:
    with step_server(tmp_path, nodelist="n1,n2") as server:
        ready = server.wait_ready()
        assert ready["job_id"] == JOB_ID
        assert ready["head"] == "n1"
        assert ready["ray_address"] == "10.1.2.3:6379"
        assert ready["started_at"].isdigit()
        assert (server.job_dir / "nodes").read_text() == "n1\nn2\n"
        assert (server.job_dir / "requests").is_dir()
        assert os.readlink(server.job_dir / "launch") == server.paths.submit_dir("tok")
        assert server.proc.poll() is None
        # written atomically: no temp files are left behind
        assert not list(server.job_dir.glob("*.tmp.*"))


def test_ready_without_ray_has_an_empty_address(tmp_path: Path) -> None:
    with step_server(tmp_path, ray_address=None) as server:
        assert server.wait_ready()["ray_address"] == ""


# -- steps -------------------------------------------------------------------------------------


def test_requested_step_runs_and_its_output_lands_in_its_files(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        inv = server.request(
            "r1", 'echo "hello from the step"\necho "to stderr" >&2\n'
            'echo "ray=$RAY_ADDRESS"\nexit 3',
            name="my_step",
        )
        # srun's status reaches the status file when the step writes none itself
        assert server.status(inv) == "3"
        assert Path(inv.stdout).read_text() == "hello from the step\nray=10.1.2.3:6379\n"
        assert Path(inv.stderr).read_text() == "to stderr\n"
        requests = server.job_dir / "requests"
        assert (requests / "r1.taken").exists() and not (requests / "r1.request").exists()
        srun = (server.logs / "srun.args").read_text().split()
        assert "--overlap" in srun and "--nodelist=n1" in srun
        assert "--job-name=my_step" in srun
        assert srun[-2:] == ["bash", inv.file("dagster_slurm_step.sh")]


def test_a_status_written_by_the_step_is_kept(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        inv = server.paths.invocation(JOB_ID, "step-r1", "inv")
        server.request("r1", f"echo 7 > {shlex.quote(inv.status)}\nexit 0")
        assert server.status(inv) == "7"
        pid = int((server.logs / "srun.pids").read_text().split()[0])
        wait_for(lambda: gone(pid), what="the first step to end")
        # the second step's status is written by the server's reaping, which also covers
        # the first (already ended) step: its own status must survive that
        assert server.status(server.request("r2", "exit 6")) == "6"
        assert Path(inv.status).read_text().strip() == "7"
        assert "request r1 ended" not in server.log()


def test_steps_run_concurrently_and_a_bad_request_is_skipped(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        flag = tmp_path / "release"
        first = server.request("r1", WAIT_LOOP.format(flag=shlex.quote(str(flag))) + "\nexit 0")
        server.request("bad", "exit 0", lines=["only", "three", "lines"])
        second = server.request("r2", "exit 4")
        # the second step ends while the first still waits
        assert server.status(second) == "4"
        assert read(first.status) is None
        flag.write_text("go")
        assert server.status(first) == "0"
        assert "unreadable request bad" in server.log()
        assert server.proc.poll() is None


def test_cancel_file_stops_a_running_step(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        started = tmp_path / "started"
        body = (f"touch {shlex.quote(str(started))}\n"
                + WAIT_LOOP.format(flag=shlex.quote(str(tmp_path / "never"))) + "\nexit 0")
        inv = server.request("r1", body)
        wait_for(started.exists, what="the step to start")
        server.cancel("r1")
        assert server.status(inv) == str(128 + signal.SIGTERM)
        assert "cancelling step of request r1" in server.log()
        # the server goes on serving
        assert server.status(server.request("r2", "exit 0")) == "0"


# -- drain -------------------------------------------------------------------------------------


def _usr1_step(tmp_path: Path) -> tuple[Path, Path, str]:
    """A step body that waits until USR1, records it in ``got`` and exits 5; it touches
    ``started`` first. Returns (started, got, body)."""
    started, got = tmp_path / "started", tmp_path / "got-usr1"
    body = (f"trap 'echo USR1 > {shlex.quote(str(got))}; exit 5' USR1\n"
            f"touch {shlex.quote(str(started))}\n"
            + WAIT_LOOP.format(flag=shlex.quote(str(tmp_path / "never"))) + "\nexit 0")
    return started, got, body


def test_drain_signal_is_recorded_forwarded_and_stops_new_steps(tmp_path: Path) -> None:
    with step_server(tmp_path, drain_signal="USR1") as server:
        server.wait_ready()
        started, got, body = _usr1_step(tmp_path)
        running = server.request("r1", body)
        wait_for(started.exists, what="the step to start")
        server.signal(signal.SIGUSR1)
        wait_for(lambda: read(server.paths.drained(JOB_ID)) == "USR1\n",
                 what=f"the drained file\n{server.log()}")
        wait_for(got.exists, what=f"the step to receive USR1\n{server.log()}")
        assert got.read_text() == "USR1\n"
        assert server.status(running) == "5"
        # the server itself keeps running after a drain
        assert server.proc.poll() is None
        # a request after the drain is answered without running
        ran = tmp_path / "ran"
        late = server.request("r2", f"touch {shlex.quote(str(ran))}\nexit 9")
        assert server.status(late) == "0"
        assert read(late.drain) == "USR1\n"
        assert not ran.exists()
        assert read(late.stdout) is None
        assert "step step-r2 not started" in server.log()
        assert (server.logs / "srun.args").read_text().count("\n") == 1


def test_drain_reaches_a_step_that_was_still_starting_once_it_has_its_step_id(
        tmp_path: Path) -> None:
    with step_server(tmp_path, drain_signal="USR1") as server:
        server.wait_ready()
        go, got = tmp_path / "go", tmp_path / "got-usr1"
        inv_file = server.paths.invocation(JOB_ID, "step-r1", "inv").file("slurm_step_id")
        body = (f"trap 'echo USR1 > {shlex.quote(str(got))}; exit 5' USR1\n"
                + WAIT_LOOP.format(flag=shlex.quote(str(go))) + "\n"
                f"printf '%s\\n' \"$SLURM_STEP_ID\" > {shlex.quote(inv_file)}\n"
                + WAIT_LOOP.format(flag=shlex.quote(str(tmp_path / "never"))) + "\nexit 0")
        running = server.request("r1", body, record=False)
        wait_for(lambda: "started step step-r1" in server.log(), what="the step to start")
        server.signal(signal.SIGUSR1)
        wait_for(lambda: read(server.paths.drained(JOB_ID)) == "USR1\n",
                 what=f"the drained file\n{server.log()}")
        assert not got.exists()  # no step id yet: nothing was sent
        go.touch()
        assert server.status(running) == "5"
        assert got.read_text() == "USR1\n"
        assert (server.logs / "scancel.args").read_text() == "--signal=USR1 42.0\n"
        assert "drain signal USR1 sent to step 42.0 (step-r1)" in server.log()


def test_drain_with_no_step_running_still_refuses_later_steps(tmp_path: Path) -> None:
    with step_server(tmp_path, drain_signal="USR2") as server:
        server.wait_ready()
        server.signal(signal.SIGUSR2)
        wait_for(lambda: read(server.paths.drained(JOB_ID)) == "USR2\n",
                 what=f"the drained file\n{server.log()}")
        late = server.request("r1", "exit 9")
        assert server.status(late) == "0"
        assert read(late.drain) == "USR2\n"
        assert server.proc.poll() is None


# -- leaving -----------------------------------------------------------------------------------


def test_term_stops_the_steps_and_the_server_exits(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        started = tmp_path / "started"
        body = (f"touch {shlex.quote(str(started))}\n"
                + WAIT_LOOP.format(flag=shlex.quote(str(tmp_path / "never"))) + "\nexit 0")
        inv = server.request("r1", body)
        wait_for(started.exists, what="the step to start")
        server.signal(signal.SIGTERM)
        assert server.proc.wait(timeout=DEADLINE) == 0
        assert "signal TERM received" in server.log()
        # the step got TERM and its status was recorded before the server left
        assert server.status(inv) == str(128 + signal.SIGTERM)


def test_term_is_the_drain_when_configured_so(tmp_path: Path) -> None:
    with step_server(tmp_path, drain_signal="TERM") as server:
        server.wait_ready()
        server.signal(signal.SIGTERM)
        wait_for(lambda: read(server.paths.drained(JOB_ID)) == "TERM\n",
                 what=f"the drained file\n{server.log()}")
        assert server.proc.poll() is None
        server.signal(signal.SIGINT)
        assert server.proc.wait(timeout=DEADLINE) == 0


# -- pace and wake-up --------------------------------------------------------------------------

IDLE_LINE = "idle: listing requests every 0.2 s until woken"


def _wait_idle(server: Server, count: int = 1) -> None:
    """Until the server has logged ``count`` idle spells (its wait reached the idle wait)."""
    wait_for(lambda: server.log().count(IDLE_LINE) >= count, what=f"the idle line\n{server.log()}")


def test_an_idle_server_is_woken_by_a_request(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        assert stat.S_ISFIFO(os.lstat(server.paths.wake(JOB_ID)).st_mode)
        _wait_idle(server)
        assert server.status(server.request("r1", "exit 0")) == "0"
        log = server.log()
        assert "started step step-r1 (request r1, found on a wake-up)" in log
        assert log.index(IDLE_LINE) < log.index("started step step-r1")
        # after the step, the server backs off again
        _wait_idle(server, 2)


def test_requests_and_cancels_are_listed_under_a_path_with_spaces_and_quotes(
        tmp_path: Path) -> None:
    root = tmp_path / "a [dir] with 'quotes' *"
    root.mkdir()
    with step_server(root) as server:
        server.wait_ready()
        assert server.status(server.request("r1", "exit 3")) == "3"
        started = root / "started"
        inv = server.request("r2", f"touch {shlex.quote(str(started))}\n"
                             + WAIT_LOOP.format(flag=shlex.quote(str(root / "never"))))
        wait_for(started.exists, what="the step to start")
        server.cancel("r2")
        assert server.status(inv) == str(128 + signal.SIGTERM)
        assert "found on a wake-up" in server.log()


def test_a_request_nobody_wakes_for_is_found_by_the_listing(tmp_path: Path) -> None:
    # what a request written on another host than the server's gets
    with step_server(tmp_path) as server:
        server.wait_ready()
        _wait_idle(server)
        assert server.status(server.request("r1", "exit 0", wake=False)) == "0"
        assert "started step step-r1 (request r1, found by the listing)" in server.log()


def test_a_cancel_wakes_an_idle_server_and_kill_follows_an_ignored_term(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        started = tmp_path / "started"
        body = (f"trap '' TERM\ntouch {shlex.quote(str(started))}\n"
                + WAIT_LOOP.format(flag=shlex.quote(str(tmp_path / "never"))) + "\nexit 0")
        inv = server.request("r1", body)
        wait_for(started.exists, what="the step to start")
        _wait_idle(server)  # a running step alone does not hold the server at its floor
        server.cancel("r1")
        wait_for(lambda: "cancelling step of request r1" in server.log(), what="the cancel")
        # TERM is ignored: KILL follows (__DS_SS_KILL_AFTER after TERM), and srun's status
        # is recorded
        assert server.status(inv) == str(128 + signal.SIGKILL)


def test_a_drain_reaches_a_step_while_the_server_is_idle(tmp_path: Path) -> None:
    with step_server(tmp_path, drain_signal="USR1") as server:
        server.wait_ready()
        started, got, body = _usr1_step(tmp_path)
        running = server.request("r1", body)
        wait_for(started.exists, what="the step to start")
        _wait_idle(server)
        server.signal(signal.SIGUSR1)
        assert server.status(running) == "5"
        assert got.read_text() == "USR1\n"
        assert read(server.paths.drained(JOB_ID)) == "USR1\n"


def test_term_ends_an_idle_server(tmp_path: Path) -> None:
    with step_server(tmp_path) as server:
        server.wait_ready()
        _wait_idle(server)
        server.signal(signal.SIGTERM)
        assert server.proc.wait(timeout=DEADLINE) == 0
        assert "signal TERM received" in server.log()


def test_without_its_fifo_the_server_lists_at_the_floor(tmp_path: Path) -> None:
    def block_the_fifo(paths: SessionPaths) -> None:
        Path(paths.wake(JOB_ID), "in-the-way").mkdir(parents=True)  # a directory: no mkfifo

    with step_server(tmp_path, before_start=block_the_fifo) as server:
        server.wait_ready()
        assert "cannot create or open the wake FIFO" in server.log()
        assert server.wake() == (False, "not a FIFO")
        assert server.status(server.request("r1", "exit 0", wake=False)) == "0"
        assert "found by the listing" in server.log()
        assert IDLE_LINE not in server.log()
