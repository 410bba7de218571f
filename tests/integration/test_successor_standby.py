"""A successor drained while it stands by for its promotion, on the dev cluster (real sbatch,
scancel --signal --batch, srun).

The drain signal (TERM: the session configures no pre-walltime signal) reaches the
successor's batch shell before its promotion: the successor stays RUNNING and the drain is
recorded in its ``jobs/<job id>/drained``. The promotion goes ahead with a warning; the
successor becomes the run's allocation, and a step started in it returns a drained outcome
with exit code 0 without running, while the allocation stays up.
"""

import os
import shutil
import subprocess
import uuid

import pytest
from compute_support import slurm_resource, squeue_state, wait_until

from dagster_slurm import SlurmRunAllocationConfig
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.session import RunSession

pytestmark = pytest.mark.integration


class _Lines:
    """A logger keeping what promotion reports."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def error(self, message: str) -> None:
        self.lines.append(("error", message))


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def test_a_successor_drained_before_promotion_stays_up_and_answers_its_steps_drained(
    slurm_cluster,
):
    env = slurm_cluster.env()
    slurm = slurm_resource(env)
    config = SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5,
                                      time_limit="00:10:00")
    session = RunSession(slurm, str(uuid.uuid4()), config, BashLauncher(),
                         activation=lambda: None)
    marks = f"{slurm.base_path()}/test-marks/standby-{uuid.uuid4().hex[:8]}"
    os.makedirs(marks)
    try:
        predecessor = session.allocation
        assert session.drain_signal == "TERM"
        successor = session.submit_successor()
        wait_until(lambda: squeue_state(env, successor.job_id) == "RUNNING", 60,
                   "the successor to run")
        log = session.paths.output_of(successor.job_id)
        wait_until(lambda: "waiting for its promotion" in (_read(log) or ""), 30,
                   "the standby to stand by")

        subprocess.run([slurm_command(env, "scancel"), "--signal=TERM", "--batch", successor.job_id], check=True,
                       env={"SLURM_CONF": env["SLURM_CONF"]})
        drained = session.paths.drained(successor.job_id)
        wait_until(lambda: _read(drained) == "TERM\n", 30,
                   f"the drain to be recorded\n{_read(log)}")
        wait_until(lambda: "before its promotion; it keeps standing by" in (_read(log) or ""),
                   30, "the standby to report the drain")
        assert squeue_state(env, successor.job_id) == "RUNNING", _read(log)

        report = _Lines()
        promoted = session.promote_successor(logger=report)
        assert promoted.job_id == successor.job_id and session.allocation is promoted
        warnings = [text for level, text in report.lines if level == "warning"]
        assert any(f"{successor.job_id} was drained (TERM)" in text for text in warnings), report

        ran = f"{marks}/ran"
        step = session.execute_in_session(["bash", "-c", f"touch {ran}"], name="after-drain")
        assert step.drained and step.drain_signal == "TERM" and step.exit_code == 0
        assert not os.path.exists(ran)  # the payload never started
        assert "before this server started" in (_read(log) or "")
        assert squeue_state(env, successor.job_id) == "RUNNING"  # still up, drained
        wait_until(lambda: squeue_state(env, predecessor.job_id) in ("", "COMPLETING",
                                                                     "CANCELLED"),
                   60, "the predecessor to be released")
    finally:
        session.close(cancel=True)
        slurm.close()
        shutil.rmtree(marks, ignore_errors=True)
