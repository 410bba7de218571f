"""The shared login (dagster-slurm login) on the dev cluster's key login node: real ssh master,
real sshd, real Slurm and Dagster."""

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import (
    PAYLOAD_OK,
    compute,
    materialize_one,
    run_logs,
    slurm_resource,
    squeue_state,
    step_failure,
    wait_until,
    write_payload,
)

from dagster_slurm.devcluster.info import slurm_command

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "dagster_slurm.cli"]


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def login(env):
    """A shared login to the key login node, ended after the test."""
    done = _cli(env, "login")
    assert done.returncode == 0, done.stderr
    yield
    _cli(env, "logout")


def _accepted(slurm_cluster) -> int:
    log = Path(slurm_cluster.state_dir) / "log" / "sshd.log"
    return sum(1 for line in log.read_text(errors="replace").splitlines() if "Accepted " in line)


def _required(env: dict[str, str], mode: str = "required"):
    # built from settings (not model_copy): Dagster rebuilds a run's resources from them
    return compute(env, slurm=slurm_resource({**env, "SLURM_EDGE_NODE_SHARED_LOGIN": mode}))


def test_login_status_and_logout_say_what_they_did(env, slurm_cluster):
    assert _cli(env, "login", "--status").returncode == 1
    before = _accepted(slurm_cluster)
    started = _cli(env, "login")
    assert started.returncode == 0, started.stderr
    status = _cli(env, "login", "--status")
    assert status.returncode == 0
    assert f"{env['SLURM_EDGE_NODE_USER']}@127.0.0.1:{env['SLURM_EDGE_NODE_PORT']}: up" in status.stdout
    assert "logged in by" in status.stdout and "after the last command" in status.stdout
    again = _cli(env, "login")  # already up: no second login
    assert again.returncode == 0 and _accepted(slurm_cluster) - before == 1
    assert "ended" in _cli(env, "logout").stdout
    assert _cli(env, "login", "--status").returncode == 1


def test_runs_through_the_shared_login_add_no_logins(env, tmp_path, slurm_cluster, login):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    resource = _required(env)
    before = _accepted(slurm_cluster)
    for _ in range(2):
        result = materialize_one(payload, resource)
        assert result.success
    assert _accepted(slurm_cluster) == before, "a run logged in by itself"
    assert any("using the shared login" in m or "Submitted Slurm job" in m
               for m in run_logs(result))


def test_without_the_shared_login_required_mode_fails_at_once_naming_the_command(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    result = materialize_one(payload, _required(env), raise_on_error=False)
    text = step_failure(result)
    assert "LoginRequired" in text and "dagster-slurm login --host 127.0.0.1" in text


def _held_payload(directory: Path, slurm_cluster, words: str) -> tuple[str, Path]:
    """A payload that logs ``words`` and runs until the returned file appears (at most 240 s)."""
    release = Path(slurm_cluster.deployment_base_path) / f"release-{uuid.uuid4().hex[:8]}"
    return write_payload(directory, "held.py", f"""
        import os, time
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            pipes.log.info({words!r})
            deadline = time.monotonic() + 240
            while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:
                time.sleep(0.2)
    """), release


def _materialize_in_thread(payload: str, resource, instance) -> tuple[threading.Thread, dict]:
    out: dict = {}
    runner = threading.Thread(target=lambda: out.__setitem__(
        "result", materialize_one(payload, resource, raise_on_error=False, instance=instance)))
    runner.start()
    return runner, out


def _logout_fails_the_step(env: dict[str, str], runner: threading.Thread, out: dict) -> None:
    """End the shared login; the step waiting on its Slurm work fails naming the command."""
    assert "ended" in _cli(env, "logout").stdout
    runner.join(120)
    assert not runner.is_alive(), "the step did not fail after the login ended"
    text = step_failure(out["result"])
    assert "LoginRequired" in text and "dagster-slurm login" in text


def _release_and_cancel(env: dict[str, str], release: Path, runner: threading.Thread,
                        job_id: str | None) -> None:
    release.write_text("")
    runner.join(120)
    if job_id:
        subprocess.run([slurm_command(env, "scancel"), job_id], env={"SLURM_CONF": env["SLURM_CONF"]}, check=False)


def test_a_lost_login_fails_the_step_keeps_the_job_and_the_next_login_works(
        env, tmp_path, slurm_cluster, login):
    held, release = _held_payload(tmp_path, slurm_cluster, "holding")
    resource = _required(env)
    instance = dg.DagsterInstance.ephemeral()
    runner, out = _materialize_in_thread(held, resource, instance)
    job_id = None
    try:
        def running_job() -> str | None:
            for run in instance.get_runs():
                for entry in instance.all_logs(run.run_id):
                    message = entry.user_message or ""
                    if "Submitted Slurm job" in message:
                        found = message.split("Submitted Slurm job", 1)[1].split()[0]
                        if squeue_state(env, found) == "RUNNING":
                            return found
            return None

        job_id = wait_until(running_job, 120, "the held job to run")
        _logout_fails_the_step(env, runner, out)
        assert squeue_state(env, job_id) == "RUNNING", "the lost login cancelled the job"
        assert any("is left as it is" in (m or "") for m in run_logs(out["result"]))
        relogin = _cli(env, "login")
        assert relogin.returncode == 0, relogin.stderr
        quick = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
        assert materialize_one(quick, resource).success
    finally:
        _release_and_cancel(env, release, runner, job_id)


def test_run_scope_a_lost_login_keeps_the_allocation_and_its_step(env, tmp_path, slurm_cluster,
                                                                  login):
    from dagster_slurm import ComputeResource, SlurmRunAllocationConfig

    held, release = _held_payload(tmp_path, slurm_cluster, "holding in the allocation")
    resource = ComputeResource(
        mode="slurm", slurm=slurm_resource({**env, "SLURM_EDGE_NODE_SHARED_LOGIN": "required"}),
        allocation_scope="run",
        run_allocation=SlurmRunAllocationConfig(heartbeat_interval=2.0),
        env_packages=["dagster-pipes"],
    )
    instance = dg.DagsterInstance.ephemeral()
    runner, out = _materialize_in_thread(held, resource, instance)
    allocation = None
    try:
        def holding() -> bool:
            return any("holding in the allocation" in (entry.user_message or "")
                       for run in instance.get_runs() for entry in instance.all_logs(run.run_id))

        wait_until(holding, 180, "the payload to run in the allocation")
        (run,) = instance.get_runs()
        names = subprocess.run([slurm_command(env, "squeue"), "-h", "-o", "%i|%j|%T"], capture_output=True,
                               text=True, env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.split()
        (allocation,) = [line.split("|")[0] for line in names
                         if line.split("|")[1].startswith(f"dsr-{run.run_id}")]
        _logout_fails_the_step(env, runner, out)
        assert squeue_state(env, allocation) == "RUNNING", "the lost login ended the allocation"
        steps = subprocess.run([slurm_command(env, "squeue"), "-h", "-s", "-j", allocation, "-o", "%i"],
                               capture_output=True, text=True,
                               env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.split()
        assert any(not step.endswith((".batch", ".extern")) for step in steps), (
            f"the payload's job step was cancelled: {steps}")
    finally:
        _release_and_cancel(env, release, runner, allocation)


def test_the_orphan_sensor_logs_in_once_for_all_its_ticks(env, slurm_cluster):
    from dagster_slurm import build_slurm_orphan_reconcile_sensor

    slurm = slurm_resource(env)
    slurm = slurm.model_copy(update={"ssh": slurm.ssh.model_copy(update={"shared_login": "off",
                                                                        "connect_timeout": 14.0})})
    sensor = build_slurm_orphan_reconcile_sensor(slurm=slurm)
    before = _accepted(slurm_cluster)
    with dg.instance_for_test() as instance:
        for _ in range(3):
            sensor(dg.build_sensor_context(instance=instance))
    assert _accepted(slurm_cluster) - before == 1, "the sensor logged in again at a tick"


def test_auto_mode_after_the_shared_login_ended_logs_in_itself(env, slurm_cluster):
    ssh = slurm_resource(env).ssh.model_copy(update={"connect_timeout": 13.0})
    transport = ssh.get_transport()
    assert _cli(env, "login").returncode == 0
    try:
        assert transport.run(["hostname"]).stdout.strip() == "login"
        assert transport.mechanism == "shared login"
    finally:
        _cli(env, "logout")
    before = _accepted(slurm_cluster)
    assert transport.run(["hostname"]).stdout.strip() == "login"
    assert transport.mechanism == "paramiko" and _accepted(slurm_cluster) - before == 1
    transport.close()
