"""The scaling hooks on the dev cluster: inspect, reconcile_workers, assign_worker_intent.

What is shown, with real Slurm (sbatch, squeue -O, sacct, scancel), the real agent and SSH:

* ``inspect()`` sees every allocation of a session in one SSH round trip and one squeue: a
  running GPU worker's grant (``tres``, ``granted_gpus``, time left), a pending one's reason,
  the bookkeeping of the intent that submitted one (``submitted_at``), nothing made up.
* Eight processes reconcile the same intent (count 3) at once for 20 rounds while one of its
  jobs is cancelled meanwhile: never a duplicate; sacct lists exactly the three first jobs
  and one replacement.
* A connection cut right after sbatch (the agent is hung up before it records the job id,
  as sshd does when the connection drops): the next call reports the job in ``recovered``
  and submits no second job.
* slurmctld stopped: ``inspect().certain`` is False with every state None, reconcile
  submits nothing and says why; after the restart it proceeds.
* An allocation pending past ``pending_timeout`` is cancelled and not replaced in that
  call; the next call replaces it.
* A supervisor that dies after persisting a drain deadline (before its drain was sent): a
  fresh process cancels the job once the deadline (plus grace) passed.

Workers here wait in the queue (``--begin=now+1hour``) or, where a running one is needed,
wait for a head that never comes; no Ray is started, so each case takes seconds.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from compute_support import squeue_state, wait_until
from reconcile_support import GPU, QUEUED, headless_session

from dagster_slurm import WorkerIntent
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.session.session import RunSession

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
SHIMS = "/home/dslurm/dagster-slurm/test-shims"


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _close(session: RunSession) -> None:
    session.close(cancel=True)
    session.slurm.close()


def _env(env: dict[str, str]) -> dict[str, str]:
    return {"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}


def _sacct_jobs(env: dict[str, str], job_name: str) -> dict[str, str]:
    """job id -> state of every allocation sacct knows by ``job_name`` (the window reaches
    into the future: a job that waits for its begin time is selected by it)."""
    out = subprocess.run([slurm_command(env, "sacct"), "-n", "-X", "-P", f"--name={job_name}", "-o", "JobID,State",
                          "-S", "now-1hour", "-E", "now+3hours"], env=_env(env),
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if line.strip())


def _queued(env: dict[str, str], job_name: str) -> list[str]:
    out = subprocess.run([slurm_command(env, "squeue"), "-h", f"--name={job_name}", "-t", "PENDING,RUNNING",
                          "-o", "%i"], env=_env(env), capture_output=True, text=True,
                         check=True).stdout
    return sorted(out.split())


def _shim_python(name: str, body: str) -> str:
    """A python3 wrapper for the agent whose PATH starts with a directory holding one shim
    command (``name``, a shell script ``body``): the agent runs it instead of Slurm's."""
    directory = Path(SHIMS) / uuid.uuid4().hex
    (directory / "bin").mkdir(parents=True)
    for path in (Path(SHIMS), directory, directory / "bin"):
        path.chmod(0o755)
    shim = directory / "bin" / name
    shim.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    shim.chmod(0o755)
    wrapper = directory / "python3"
    wrapper.write_text(f'#!/bin/sh\nPATH={directory / "bin"}:$PATH exec python3 "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


# -- inspect --------------------------------------------------------------------------------------
@pytest.mark.release_subset
def test_inspect_sees_every_allocation_in_one_round_trip_and_one_squeue(env):
    session = headless_session(env)
    try:
        running = session.add_worker_allocation(GPU)
        queued = session.reconcile_workers(WorkerIntent(key="queued", count=1, config=QUEUED))
        wait_until(lambda: squeue_state(env, running.job_id) == "RUNNING", 60,
                   "the GPU worker to run")
        scheduler = session.slurm.scheduler()
        transport = scheduler.agent.transport
        trips, squeues = transport.stats.round_trips, scheduler.stats.by_command.get("squeue", 0)
        snapshot = session.inspect()
        assert transport.stats.round_trips - trips == 1
        assert scheduler.stats.by_command.get("squeue", 0) - squeues == 1
        assert snapshot.certain and snapshot.observed_at is not None
        assert abs(snapshot.observed_at - time.time()) < 30  # the login node's clock
        gpu = snapshot.worker(running.job_id)
        assert gpu is not None and gpu.state == "RUNNING" and gpu.granted_gpus == 1
        assert "gres/gpu=1" in (gpu.tres or "") and gpu.nodes and gpu.nodes[0].startswith("g")
        assert gpu.time_left_seconds is not None and 0 < gpu.time_left_seconds <= 300
        assert (gpu.intent, gpu.submitted_at, gpu.committed, gpu.ready) == (None, None, True, False)
        assert gpu.requested_gpus_per_node == 1 and gpu.drain_deadline is None
        assert queued.submitted, queued
        (pending,) = snapshot.workers("queued")
        assert pending.slurm_job_id == queued.submitted[0]
        assert (pending.state, pending.reason) == ("PENDING", "BeginTime")
        assert pending.time_left_seconds is None and pending.granted_gpus is None
        assert pending.submitted_at is not None and pending.nodes == ()
        assert snapshot.head is None and snapshot.successor is None
        # moved out of its intent: no longer counted, the intent submits another
        session.assign_worker_intent(pending.slurm_job_id, None)
        again = session.reconcile_workers(WorkerIntent(key="queued", count=1, config=QUEUED))
        assert len(again.submitted) == 1 and pending.slurm_job_id not in again.live
    finally:
        _close(session)


# -- no duplicates across processes --------------------------------------------------------------
RECONCILER = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, os.environ["TEST_HERE"])
from reconcile_support import QUEUED, headless_session
from dagster_slurm import WorkerIntent

session = headless_session(dict(os.environ), os.environ["RUN_ID"])
start = Path(os.environ["START"])
while not start.exists():
    time.sleep(0.05)
submitted, errors = [], []
for _ in range(20):
    try:
        result = session.reconcile_workers(WorkerIntent(key="pool", count=3, config=QUEUED))
        submitted.extend(result.submitted)
    except Exception as exc:  # reported to the test
        errors.append(f"{type(exc).__name__}: {exc}")
print(json.dumps({"submitted": submitted, "errors": errors}), flush=True)
session.slurm.close()
"""


@pytest.mark.slow
def test_eight_processes_reconciling_one_intent_never_submit_a_duplicate(env, tmp_path):
    run_id = str(uuid.uuid4())
    session = headless_session(env, run_id)
    start = tmp_path / "start"
    script = tmp_path / "reconciler.py"
    script.write_text(textwrap.dedent(RECONCILER))
    procs = [subprocess.Popen([sys.executable, str(script)], env={
        **os.environ, **env, "RUN_ID": run_id, "START": str(start), "TEST_HERE": str(HERE)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    try:
        start.touch()
        first = wait_until(lambda: len(_queued(env, session.job_name)) == 3
                           and _queued(env, session.job_name), 120, "three pool allocations")
        subprocess.run([slurm_command(env, "scancel"), first[0]], env=_env(env), check=True)  # one goes away
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
        assert [o["errors"] for o in outputs] == [[]] * 8
        submitted = [job for o in outputs for job in o["submitted"]]
        live = _queued(env, session.job_name)
        assert len(live) == 3 and first[0] not in live
        jobs = wait_until(lambda: len(_sacct_jobs(env, session.job_name)) == 4
                          and _sacct_jobs(env, session.job_name), 60, "sacct to list four jobs")
        assert sorted(submitted) == sorted(jobs), (submitted, jobs)  # each submitted once
        assert jobs[first[0]].startswith("CANCELLED")
        snapshot = session.inspect()
        assert sorted(w.slurm_job_id for w in snapshot.workers("pool")
                      if w.committed) == live
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        _close(session)


# -- recovery around submission ------------------------------------------------------------------
@pytest.mark.release_subset
def test_a_connection_cut_after_sbatch_is_recovered_and_not_submitted_twice(env, tmp_path):
    mark = Path(SHIMS) / f"cut-{uuid.uuid4().hex}"
    python = _shim_python("sbatch", f"""\
        /usr/bin/sbatch "$@"; rc=$?
        # once: hang the agent up right after sbatch answered, before it records the job
        # id (what sshd does to a command whose connection dropped)
        if [ -e {mark} ] && rm -f {mark}; then kill -HUP $PPID; sleep 1; fi
        exit $rc
        """)
    mark.touch()
    mark.chmod(0o666)
    Path(mark).parent.chmod(0o777)
    session = headless_session(env, python=python)
    intent = WorkerIntent(key="cut", count=1, config=QUEUED)
    try:
        with pytest.raises(DagsterSlurmError):
            session.reconcile_workers(intent)
        (job_id,) = wait_until(lambda: _queued(env, session.job_name), 30, "the queued job")
        doc = json.loads(Path(session.paths.document).read_text())
        (submission,) = doc["worker_submissions"].values()
        assert submission["status"] == "submitting" and job_id not in doc.get("workers", {})
        result = session.reconcile_workers(intent)
        assert result.recovered == (job_id,) and result.submitted == ()
        assert result.live == (job_id,)
        assert _queued(env, session.job_name) == [job_id]
        assert session.reconcile_workers(intent).submitted == ()
        assert wait_until(lambda: list(_sacct_jobs(env, session.job_name)), 30,
                          "sacct to list the job") == [job_id]
    finally:
        _close(session)


# -- the scheduler does not answer ---------------------------------------------------------------
def _slurmctld(env: dict[str, str]) -> tuple[int, Path]:
    pid_file = Path(env["SLURM_CONF"]).parent.parent / "run" / "slurmctld.pid"
    return int(pid_file.read_text().split()[0]), pid_file


@pytest.mark.slow
def test_a_stopped_slurmctld_submits_nothing_and_says_why_then_it_proceeds(env, slurm_cluster):
    from dagster_slurm.devcluster import DevCluster

    session = headless_session(env)
    intent = WorkerIntent(key="ctld", count=1, config=QUEUED)
    pid, _ = _slurmctld(env)
    os.kill(pid, signal.SIGTERM)
    try:
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30, "slurmctld to exit")
        snapshot = session.inspect()
        assert not snapshot.certain and snapshot.error
        result = session.reconcile_workers(intent)
        assert result.submitted == () and "did not answer" in result.held_back[0]
    finally:
        DevCluster(state_dir=slurm_cluster.state_dir).up()
    try:
        wait_until(lambda: subprocess.run([slurm_command(env, "squeue"), "-h"], env=_env(env), capture_output=True,
                                          check=False).returncode == 0, 60, "slurmctld back")
        result = session.reconcile_workers(intent)
        assert len(result.submitted) == 1 and not result.held_back
        assert session.inspect().certain
    finally:
        _close(session)


# -- pending_timeout -----------------------------------------------------------------------------
def test_an_allocation_pending_past_its_timeout_is_cancelled_and_replaced_next_call(env):
    session = headless_session(env)
    intent = WorkerIntent(key="short", count=1, config=QUEUED, pending_timeout=3)
    try:
        (first,) = session.reconcile_workers(intent).submitted
        (w,) = session.inspect().workers("short")
        assert w.submitted_at is not None
        wait_until(lambda: (session.inspect().observed_at or 0) >= w.submitted_at + 3, 30,
                   "the pending timeout to pass")
        result = session.reconcile_workers(intent)
        assert result.cancelled == (first,) and result.submitted == ()
        assert any("pending_timeout=3" in line for line in result.held_back)
        wait_until(lambda: squeue_state(env, first) in ("", "CANCELLED"), 30, "the cancel")
        replaced = session.reconcile_workers(intent)
        assert replaced.ended == (first,) and len(replaced.submitted) == 1
    finally:
        _close(session)


# -- durable drain deadlines ---------------------------------------------------------------------
FRESH = """
import json, os, sys, time
sys.path.insert(0, os.environ["TEST_HERE"])
from reconcile_support import GPU, headless_session
from dagster_slurm import WorkerIntent
from dagster_slurm.session.scaling import plan as reconcile_plan

reconcile_plan.DRAIN_GRACE = 3.0  # the cancel follows the deadline by 3 s here
session = headless_session(dict(os.environ), os.environ["RUN_ID"])
calls = []
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    result = session.reconcile_workers(WorkerIntent(key="helpers", count=0, config=GPU))
    calls.append({"cancelled": list(result.cancelled)})
    if result.cancelled:
        break
    time.sleep(0.5)
print(json.dumps(calls), flush=True)
session.slurm.close()
"""


def test_a_deadline_persisted_by_a_dead_supervisor_is_enforced_by_a_fresh_process(env, tmp_path):
    python = _shim_python("scancel", """\
        case " $* " in
        # the supervisor dies right after persisting the deadline, before the drain is sent
        *" --signal=USR1 "*) kill -HUP $PPID; sleep 1; exit 1;;
        esac
        exec /usr/bin/scancel "$@"
        """)
    run_id = str(uuid.uuid4())
    supervisor = headless_session(env, run_id, python=python)
    intent = WorkerIntent(key="helpers", count=1, config=GPU, drain_timeout=0)
    try:
        (job_id,) = supervisor.reconcile_workers(intent).submitted
        wait_until(lambda: squeue_state(env, job_id) == "RUNNING", 60, "the worker to run")
        with pytest.raises(DagsterSlurmError):
            supervisor.reconcile_workers(WorkerIntent(key="helpers", count=0, drain_timeout=0))
        doc = json.loads(Path(supervisor.paths.document).read_text())
        persisted = doc["workers"][job_id]["drain_deadline"]
        assert persisted is not None and squeue_state(env, job_id) == "RUNNING"
        script = tmp_path / "fresh.py"
        script.write_text(textwrap.dedent(FRESH))
        fresh = subprocess.run([sys.executable, str(script)], env={
            **os.environ, **env, "RUN_ID": run_id, "TEST_HERE": str(HERE)},
            capture_output=True, text=True, timeout=120)
        assert fresh.returncode == 0, fresh.stderr[-3000:]
        calls = json.loads(fresh.stdout.strip().splitlines()[-1])
        assert calls[-1]["cancelled"] == [job_id]
        wait_until(lambda: _sacct_jobs(env, supervisor.job_name).get(job_id, "").startswith(
            "CANCELLED"), 60, "sacct to show the job cancelled")
        doc = json.loads(Path(supervisor.paths.document).read_text())
        assert doc["workers"][job_id]["drain_deadline"] == persisted  # never moved
        state = (Path(supervisor.paths.worker_state(job_id)).read_text()
                 if Path(supervisor.paths.worker_state(job_id)).exists() else "")
        assert "draining" not in state  # cancelled at the deadline, not drained
    finally:
        _close(supervisor)
