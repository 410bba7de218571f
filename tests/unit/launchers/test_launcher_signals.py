"""Signals sent to a generated job script: drains, cancellations, process groups."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from launcher_support import (
    PYTHON,
    RUN_TIMEOUT,
    SIGNAL_PAYLOAD,
    JobFiles,
    run_script,
    start_script,
    wait_for_file,
)

from dagster_slurm.launchers import BashLauncher


def _signal_payload(job: JobFiles, code: int, *handled: str) -> tuple[str, ...]:
    path = job.job_dir / "payload.py"
    path.write_text(SIGNAL_PAYLOAD)
    return (PYTHON, str(path), str(job.job_dir), str(code), *handled)


def _signal_running_job(
    job: JobFiles, script: Path, signum: int, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Start ``script``, wait for the payload to be ready, send ``signum`` to the script
    only, and return its exit status and stderr."""
    process = start_script(script, env=env)
    try:
        payload_group = int(wait_for_file(job.job_dir / "ready"))
        # The payload has a process group (and POSIX session) of its own, so it can only get
        # the signal from the script forwarding it.
        assert payload_group != os.getpgid(process.pid)
        assert payload_group == int(job.pid_file.read_text())
        os.kill(process.pid, signum)
        _, stderr = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stderr


def test_term_is_forwarded_and_recorded_as_drain(job: JobFiles) -> None:
    script = job.write(job.plan(_signal_payload(job, 0, "TERM")))
    code, stderr = _signal_running_job(job, script, signal.SIGTERM)
    assert code == 0, stderr
    assert (job.job_dir / "got").read_text() == "TERM\n"
    assert job.drained() == "TERM"
    assert job.status() == 0


def test_configured_drain_signal_is_forwarded_and_recorded(job: JobFiles) -> None:
    plan = job.plan(_signal_payload(job, 3, "USR1"), drain_signal="SIGUSR1")
    code, stderr = _signal_running_job(job, job.write(plan), signal.SIGUSR1)
    assert code == 3, stderr
    assert (job.job_dir / "got").read_text() == "USR1\n"
    assert job.drained() == "USR1"
    assert job.status() == 3
    assert "drain signal USR1 received" in stderr


def test_cancellation_kills_payload_with_signal_status_and_is_no_drain(job: JobFiles) -> None:
    # The payload does not handle TERM, so the forwarded TERM kills it: 128 + 15.
    plan = job.plan(_signal_payload(job, 0), drain_signal="USR1")
    code, stderr = _signal_running_job(job, job.write(plan), signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, stderr
    assert job.status() == 128 + signal.SIGTERM
    assert job.drained() is None


def test_interrupt_reaches_the_payload(job: JobFiles) -> None:
    # Background jobs of a script normally ignore SIGINT; the payload must not.
    code, stderr = _signal_running_job(
        job, job.write(job.plan(_signal_payload(job, 4, "INT"))), signal.SIGINT
    )
    assert code == 4, stderr
    assert (job.job_dir / "got").read_text() == "INT\n"
    assert job.drained() is None


def test_drain_before_launch_skips_the_payload(job: JobFiles) -> None:
    ran = job.job_dir / "ran"
    launcher = BashLauncher(pre_start_commands=["kill -s USR1 $$", "echo after-drain >&2"])
    plan = job.plan(("touch", str(ran)), drain_signal="USR1")
    result = run_script(job.write(plan, launcher))
    assert result.returncode == 0, result.stderr
    assert job.status() == 0
    assert job.drained() == "USR1"
    assert not ran.exists()
    assert not job.pid_file.exists()
    assert "payload not started: drain signal USR1" in result.stderr


def test_default_drain_before_launch_is_term(job: JobFiles) -> None:
    ran = job.job_dir / "ran"
    launcher = BashLauncher(pre_start_commands=["kill -s TERM $$"])
    result = run_script(job.write(job.plan(("touch", str(ran))), launcher))
    assert result.returncode == 0
    assert job.drained() == "TERM"
    assert not ran.exists()


def test_cancellation_before_launch_skips_the_payload_with_signal_status(job: JobFiles) -> None:
    ran = job.job_dir / "ran"
    launcher = BashLauncher(pre_start_commands=["kill -s HUP $$"])
    result = run_script(job.write(job.plan(("touch", str(ran)), drain_signal="USR1"), launcher))
    assert result.returncode == 128 + signal.SIGHUP
    assert job.status() == 128 + signal.SIGHUP
    assert job.drained() is None
    assert not ran.exists()


def test_drain_during_activation_skips_the_payload(job: JobFiles, tmp_path: Path) -> None:
    activate = tmp_path / "activate.sh"
    activate.write_text("kill -s USR2 $$\n")
    ran = job.job_dir / "ran"
    plan = job.plan(("touch", str(ran)), drain_signal="USR2", activation=str(activate))
    result = run_script(job.write(plan))
    assert result.returncode == 0
    assert job.drained() == "USR2"
    assert not ran.exists()


@pytest.fixture
def path_without_setsid(tmp_path: Path) -> str:
    """A PATH offering what the script and the payload need, but no ``setsid``."""
    bin_dir = tmp_path / "bin-without-setsid"
    bin_dir.mkdir()
    for tool in ("mv", "sleep"):
        for folder in ("/usr/bin", "/bin"):
            if os.path.exists(os.path.join(folder, tool)):
                (bin_dir / tool).symlink_to(os.path.join(folder, tool))
                break
    return str(bin_dir)


def test_job_control_stands_in_for_setsid(job: JobFiles, path_without_setsid: str) -> None:
    plan = job.plan(_signal_payload(job, 0, "TERM"))
    code, stderr = _signal_running_job(
        job, job.write(plan), signal.SIGTERM, env={"PATH": path_without_setsid}
    )
    assert code == 0, stderr
    assert (job.job_dir / "got").read_text() == "TERM\n"
    assert job.drained() == "TERM"


def test_drain_right_after_launch_is_delivered_not_lost(job: JobFiles) -> None:
    # The signal may come before the payload has its process group or its handler: it is
    # kept until the group exists, then either handled (0) or fatal (128 + 15); the
    # script never hangs and always records the outcome.
    script = job.write(job.plan(_signal_payload(job, 0, "TERM")))
    process = start_script(script)
    try:
        wait_for_file(job.pid_file)
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode in (0, 128 + signal.SIGTERM), stderr
    assert job.status() == process.returncode
    assert job.drained() == "TERM"


# Records each signal it gets; once it has one, it lingers so that a second copy would
# still be recorded, then ends with 0.
COUNTING_PAYLOAD = """\
import os, signal, sys, time
out = sys.argv[1]
got = []
def handler(signum, frame):
    got.append(signum)
    with open(os.path.join(out, "got"), "a") as f:
        f.write(signal.Signals(signum).name[3:] + "\\n")
signal.signal(signal.SIGTERM, handler)
with open(os.path.join(out, "ready.tmp"), "w") as f:
    f.write(str(os.getpgrp()))
os.rename(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1.0)  # a forwarded copy comes within milliseconds of the first
sys.exit(0 if got else 99)
"""


def _slurm_step_env(tmp_path: Path, proctrack: str) -> dict[str, str]:
    """The environment of a Slurm job step whose scontrol reports ``proctrack``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\nprintf 'ProctrackType           = {proctrack}\\n'\n")
    scontrol.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "3"}


@pytest.mark.parametrize(
    ("proctrack", "slurm_signals_payload"),
    [("proctrack/linuxproc", True), ("proctrack/cgroup", True), ("proctrack/pgid", False)],
)
def test_a_step_signal_reaches_the_payload_once(
    job: JobFiles, tmp_path: Path, proctrack: str, slurm_signals_payload: bool
) -> None:
    # Slurm signals every process of a step (linuxproc, cgroup): the payload's group gets
    # the drain from Slurm and must not get a second copy from the script. With pgid only
    # the script's group is signalled, and the script forwards.
    path = job.job_dir / "payload.py"
    path.write_text(COUNTING_PAYLOAD)
    script = job.write(job.plan((PYTHON, str(path), str(job.job_dir)), mode="slurm"))
    process = start_script(script, env=_slurm_step_env(tmp_path, proctrack))
    try:
        payload_group = int(wait_for_file(job.job_dir / "ready"))
        os.kill(process.pid, signal.SIGTERM)
        if slurm_signals_payload:
            os.killpg(payload_group, signal.SIGTERM)
        _, stderr = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert (job.job_dir / "got").read_text() == "TERM\n", stderr
    assert job.drained() == "TERM"
    assert ("not forwarded" in stderr) is slurm_signals_payload, stderr


def test_a_batch_script_forwards_even_where_slurm_tracks_descendants(
    job: JobFiles, tmp_path: Path
) -> None:
    # The batch script has no SLURM_STEP_ID: 'scancel --batch' and a B: signal reach the
    # script only, so it forwards.
    path = job.job_dir / "payload.py"
    path.write_text(COUNTING_PAYLOAD)
    script = job.write(job.plan((PYTHON, str(path), str(job.job_dir)), mode="slurm"))
    env = _slurm_step_env(tmp_path, "proctrack/linuxproc")
    del env["SLURM_STEP_ID"]
    process = start_script(script, env=env)
    try:
        wait_for_file(job.job_dir / "ready")
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert (job.job_dir / "got").read_text() == "TERM\n", stderr
