"""replace_head on the dev cluster, from several processes at once (real sbatch, scancel,
state lock).

Four processes call replace_head after the head allocation was cancelled: one election
(term 1), one new allocation, the same head for all. An elector SIGKILLed while its new
head waits in the queue blocks the next caller only for the claim's lease; that caller then
takes the allocation the dead elector submitted (no second head).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from compute_support import squeue_state, wait_until
from head_elector import election_session

from dagster_slurm.devcluster.info import slurm_command

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _elector(env: dict[str, str], run_id: str, *extra: str) -> subprocess.Popen:
    path = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.Popen([sys.executable, str(HERE / "head_elector.py"), run_id, *extra],
                            env={**os.environ, **env, "PYTHONPATH": path},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _document(session) -> dict:
    return json.loads(Path(session.paths.document).read_text())


def _running(env: dict[str, str], session) -> list[str]:
    out = subprocess.run([slurm_command(env, "squeue"), "-h", "--name", session.job_name, "-t", "RUNNING,PENDING",
                          "-o", "%i"], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def _queue(env: dict[str, str]) -> str:
    return subprocess.run([slurm_command(env, "squeue"), "-o", "%i %j %T %N %R"], env={**os.environ, **env},
                          capture_output=True, text=True).stdout


def test_four_processes_elect_one_head(env):
    run_id = str(uuid.uuid4())
    session = election_session(env, run_id)
    try:
        first = session.allocation.job_id
        subprocess.run([slurm_command(env, "scancel"), first], env={**os.environ, **env}, check=True)
        wait_until(lambda: squeue_state(env, first) in ("", "CANCELLED", "COMPLETED"), 60,
                   "the head to end")
        electors = [_elector(env, run_id) for _ in range(4)]
        heads = []
        for proc in electors:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
            heads.append(json.loads(out.strip().splitlines()[-1])["job_id"])
        assert len(set(heads)) == 1 and heads[0] != first, heads
        assert _running(env, session) == [heads[0]]  # one new allocation, no duplicate
        doc = _document(session)
        assert doc["election"]["term"] == 1 and doc["election"]["claimed_by"] is None
        assert doc["allocation"]["job_id"] == heads[0]
        # a healthy head is returned unchanged, here too
        assert session.replace_head(timeout=60).job_id == heads[0]
    finally:
        session.close(cancel=True)


def test_a_killed_elector_blocks_the_next_caller_only_for_its_lease(env):
    run_id = str(uuid.uuid4())
    session = election_session(env, run_id)
    filler = None
    try:
        first = session.allocation.job_id
        # both cpu nodes busy: the elected head waits in the queue
        filler = subprocess.run(
            [slurm_command(env, "sbatch"), "--parsable", "-p", "cpu", "-N", "2", "--exclusive", "-t", "5",
             "--job-name=dsl-filler", "--output=/dev/null", "--chdir=/tmp",
             "--wrap", "sleep 300"],
            env={**os.environ, **env}, capture_output=True, text=True, check=True,
        ).stdout.strip().split(";")[0]
        subprocess.run([slurm_command(env, "scancel"), first], env={**os.environ, **env}, check=True)
        wait_until(lambda: squeue_state(env, first) in ("", "CANCELLED", "COMPLETED"), 60,
                   "the head to end")
        wait_until(lambda: squeue_state(env, filler) == "RUNNING", 120,
                   "the filler to run")
        elector = _elector(env, run_id, "12")
        def submitted_by_the_elector() -> bool:
            doc = _document(session)
            head = doc.get("allocation") or {}
            return bool((doc.get("election") or {}).get("claimed_by")
                        and head.get("status") == "submitted"
                        and head.get("job_id") not in (None, first))

        wait_until(submitted_by_the_elector, 60, "the elector's claim and its submission")
        os.kill(elector.pid, signal.SIGKILL)
        elector.wait(30)
        submitted = _document(session)["allocation"]["job_id"]
        assert squeue_state(env, submitted) == "PENDING"
        subprocess.run([slurm_command(env, "scancel"), filler], env={**os.environ, **env}, check=True)
        filler = None
        head = session.replace_head(timeout=180)
        assert head.job_id == submitted  # the dead elector's allocation, no second head
        assert _running(env, session) == [submitted]
    finally:
        if filler:
            subprocess.run([slurm_command(env, "scancel"), filler], env={**os.environ, **env}, check=False)
        session.close(cancel=True)


def test_a_failed_step_of_a_replaced_head_that_still_runs_raises_allocation_ended(env):
    """The driver lost its head: the session names another head while the old job runs."""
    from compute_support import slurm_resource

    from dagster_slurm import SlurmAllocationEnded
    from dagster_slurm.agent import write_file_op

    run_id = str(uuid.uuid4())
    session = election_session(env, run_id)
    slurm = slurm_resource(env)
    marks = f"{slurm.base_path()}/test-marks/replaced-{uuid.uuid4().hex[:8]}"
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    outcome: dict = {}
    try:
        old = session.allocation
        script = (f"touch {marks}/started; while [ ! -e {marks}/go ]; do sleep 0.2; done; "
                  "exit 1")

        def driver() -> None:
            try:
                outcome["result"] = session.execute_in_session(["bash", "-c", script],
                                                               name="driver")
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["error"] = exc

        thread = threading.Thread(target=driver)
        thread.start()
        wait_until(lambda: os.path.exists(f"{marks}/started"), 60, "the driver to start")
        session.forget(old, "REPLACED")  # another head takes over while the old job runs
        new = session.allocation
        assert new.job_id != old.job_id and squeue_state(env, old.job_id) == "RUNNING"
        Path(f"{marks}/go").touch()
        thread.join(60)
        assert not thread.is_alive()
        error = outcome.get("error")
        assert isinstance(error, SlurmAllocationEnded), outcome
        assert error.result.allocation_state == "REPLACED"
        assert error.result.exit_code == 1
    finally:
        session.close(cancel=True)
