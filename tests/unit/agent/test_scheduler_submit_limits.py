"""SlurmScheduler.submit under a submission limit, through the real agent and fake Slurm
commands: refused twice, then accepted; the limit read once and said in words."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest
from agent_support import write_script

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.errors import SubmitLimitReached
from dagster_slurm.scheduler.client import SlurmScheduler
from dagster_slurm.scheduler.submit_wait import LimitWait
from dagster_slurm.slurm.commands import SbatchSpec

USER = getpass.getuser()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def limited(bindir: Path, tmp_path: Path) -> Path:
    """sbatch refuses while the file ``refusals`` holds a positive count (and counts down)."""
    refusals = tmp_path / "refusals"
    calls = tmp_path / "sbatch_calls"
    write_script(bindir, "sbatch", f"""\
        echo x >> {calls}
        n=$(cat {refusals})
        if [ "$n" -gt 0 ]; then
          echo $((n - 1)) > {refusals}
          echo 'sbatch: error: AssocMaxSubmitJobLimit' >&2
          echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)" >&2
          exit 1
        fi
        echo 'Submitted batch job 91'
        """)
    write_script(bindir, "sacctmgr", f"""\
        case "$*" in
          *associations*) echo 'dev||||normal|'; echo 'dev|{USER}|2||normal|' ;;
          *) echo 'normal|||' ;;
        esac
        """)
    write_script(bindir, "squeue", f"""\
        echo '{USER}|dev|normal'; echo '{USER}|dev|normal'
        """)
    return refusals


def _spec(tmp_path: Path) -> SbatchSpec:
    return SbatchSpec(job_name="limited", script_path=str(tmp_path / "job.sh"))


def test_a_refused_submission_waits_and_submits_the_same_token(
        client: AgentClient, limited: Path, tmp_path: Path, state_path: str) -> None:
    limited.write_text("2")
    clock, lines = Clock(), []
    scheduler = SlurmScheduler(client, submit_interval=0.0, clock=clock, sleep=clock.sleep)
    job = scheduler.submit(_spec(tmp_path), state_path=state_path, token="dslurm-t1",
                           limit_wait=LimitWait(lines.append))
    assert job.job_id == "91" and job.token == "dslurm-t1"
    assert (tmp_path / "sbatch_calls").read_text().count("x") == 3
    assert lines[0] == (f"Slurm job 'limited': 2 of 2 jobs allowed for user {USER} are queued "
                        "(MaxSubmitJobs of account dev; sbatch: AssocMaxSubmitJobLimit); "
                        "waiting for one to end")
    assert "a slot freed" in lines[-1]
    record = json.loads(Path(state_path).read_text())["job"]
    assert record["status"] == "submitted" and record["token"] == "dslurm-t1"


def test_without_a_wait_the_refusal_is_raised_and_leaves_no_record(
        client: AgentClient, limited: Path, tmp_path: Path, state_path: str) -> None:
    limited.write_text("1")
    scheduler = SlurmScheduler(client, submit_interval=0.0)
    with pytest.raises(SubmitLimitReached, match="MaxSubmitJobs"):
        scheduler.submit(_spec(tmp_path), state_path=state_path, token="dslurm-t2")
    assert "job" not in json.loads(Path(state_path).read_text())


@pytest.fixture
def state_path(tmp_path: Path) -> str:
    return str(tmp_path / "state" / "job.json")
