"""Asset-scope jobs whose Dagster run died, on the dev cluster: real Slurm, real Dagster runs.

What is shown: an asset job cancels itself once its step stops polling (the heartbeat
file's content stops changing, whatever its mtime says) and not while the step polls;
``reconcile_orphaned_slurm_runs`` with a real Dagster instance cancels the job of a run
that is FAILURE, keeps the job of a live run, and cancels (and fails the run of) a job
whose step process was SIGKILLed once its heartbeat and the run's events are old.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest
from compute_support import slurm_resource
from session_support import Toucher, active_jobs

from dagster_slurm import reconcile_orphaned_slurm_runs
from dagster_slurm.devcluster.info import slurm_command

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).parent

SLEEPING_ASSET_RUN = """
    import os
    import dagster as dg
    from compute_support import compute
    from dagster_slurm import ComputeResource

    @dg.asset
    def sleeper(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path="sleep 600").get_results()

    limit = os.environ.get("DSLURM_TEST_JOB_HEARTBEAT")
    settings = ({"heartbeat_timeout": float(limit), "allow_short_heartbeat_timeout": True}
                if limit else {})
    instance = dg.DagsterInstance.local_temp(tempdir=os.environ["DSLURM_TEST_HOME"])
    dg.materialize([sleeper], resources={"compute": compute(dict(os.environ), **settings)},
                   instance=instance, raise_on_error=False)
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def wait_until(predicate, timeout: float, interval: float = 0.2):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def _job_ids(env: dict[str, str]) -> set[str]:
    return {row[0] for row in active_jobs(env, "dsl-")}


def _record_dir(env: dict[str, str], job_id: str) -> Path | None:
    runs = Path(env["SLURM_DEPLOYMENT_BASE_PATH"], "runs")
    for record in runs.glob("*/sleeper/*/job.json"):
        try:
            if json.loads(record.read_text()).get("job", {}).get("job_id") == job_id:
                return record.parent
        except (OSError, ValueError):
            continue
    return None


def _start_asset_run(env: dict[str, str], tmp_path: Path, home: Path,
                     **extra: str) -> tuple[subprocess.Popen, str, Path]:
    """A run of one asset-scope asset sleeping in its Slurm job, in a process of its own:
    ``(process, job id, job directory)`` once the job runs."""
    home.mkdir(parents=True, exist_ok=True)
    script = tmp_path / f"asset_run_{len(list(tmp_path.glob('asset_run_*.py')))}.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
                      + textwrap.dedent(SLEEPING_ASSET_RUN))
    known = _job_ids(env)
    proc = subprocess.Popen([sys.executable, str(script)],
                            env={**os.environ, **env, "DSLURM_TEST_HOME": str(home), **extra})
    running = wait_until(lambda: [r for r in active_jobs(env, "dsl-")
                                  if r[2] == "RUNNING" and r[0] not in known], 120)
    assert running, "the asset's job never started"
    job_id = running[0][0]
    job_dir = wait_until(lambda: _record_dir(env, job_id), 30)
    assert job_dir is not None, f"no record names job {job_id}"
    return proc, job_id, job_dir


def _scancel(env: dict[str, str], *job_ids: str) -> None:
    subprocess.run([slurm_command(env, "scancel"), *job_ids], check=False,
                   env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_asset_job_judges_heartbeat_content_and_ends_itself_once_polls_stop(env, tmp_path):
    limit = 5  # the shortest accepted (allow_short_heartbeat_timeout); polls every limit / 4
    proc, job_id, job_dir = _start_asset_run(env, tmp_path, tmp_path / "home",
                                             DSLURM_TEST_JOB_HEARTBEAT=str(limit))
    heartbeat, ended_by = job_dir / "heartbeat", job_dir / "ended_by"
    try:
        assert oct(heartbeat.stat().st_mode & 0o777) == "0o600"
        # Fresh content, stale mtime: twice the limit later the job is still there.
        stale_mtimes, contents = 0, set()
        with Toucher(str(heartbeat), "1 hour ago"):
            end = time.monotonic() + 2 * limit + 2
            while time.monotonic() < end:
                assert job_id in _job_ids(env), "the job of a polling step ended"
                stale_mtimes += heartbeat.stat().st_mtime < time.time() - 3000
                contents.add(heartbeat.read_text())
                time.sleep(0.5)
        assert stale_mtimes > 10 and len(contents) > 4, (stale_mtimes, contents)
        assert not ended_by.exists()
        # The step's process dies; the file is only touched from now on (fresh mtime).
        proc.kill()
        proc.wait(30)
        seen = {"content": heartbeat.read_text(), "changed": time.monotonic()}

        def gone() -> bool:
            content = heartbeat.read_text() if heartbeat.exists() else seen["content"]
            if content != seen["content"]:  # a poll already on its way when the step died
                seen.update(content=content, changed=time.monotonic())
            return job_id not in _job_ids(env)

        with Toucher(str(heartbeat), "now"):
            assert wait_until(gone, 60), "unchanged heartbeat content must end the job"
        took = time.monotonic() - seen["changed"]
        print(f"asset job {job_id} ended {took:.1f} s after its last heartbeat (limit {limit} s)")
        assert took >= limit, took
        assert ended_by.read_text().strip() == "heartbeat"
        assert "no heartbeat from the waiting step" in (job_dir / "stderr.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        _scancel(env, job_id)


@pytest.mark.slow
def test_reconcile_cancels_jobs_of_dead_runs_and_keeps_a_live_ones(env, tmp_path):
    home = tmp_path / "home"
    live, live_job, live_dir = _start_asset_run(env, tmp_path, home)
    dead, dead_job, dead_dir = _start_asset_run(env, tmp_path, home)
    slurm = slurm_resource(env)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(30)
        instance = dg.DagsterInstance.local_temp(tempdir=str(home))
        # <base>/runs/<run id>/<step>/<invocation>
        dead_run = instance.get_run_by_id(dead_dir.parent.parent.name)
        live_run_id = live_dir.parent.parent.name
        assert dead_run is not None and instance.get_run_by_id(live_run_id) is not None
        # A tick reads every session document, job record, heartbeat and the user's jobs in
        # one round trip (the first call also connects and checks the agent)
        transport = slurm.ssh.get_transport()
        reconcile_orphaned_slurm_runs(instance, slurm, heartbeat_timeout=600, dry_run=True)
        before = transport.stats.round_trips
        assert reconcile_orphaned_slurm_runs(instance, slurm, heartbeat_timeout=600,
                                             dry_run=True) == []
        assert transport.stats.round_trips - before == 1
        # What Dagster's run monitoring makes of a dead run worker: the run is FAILURE.
        instance.report_run_failed(dead_run, "the run worker died")
        before = transport.stats.round_trips
        assert len(reconcile_orphaned_slurm_runs(instance, slurm, heartbeat_timeout=600,
                                                 dry_run=True)) == 1
        assert transport.stats.round_trips - before == 1, "a candidate needs no more reads"
        reports = reconcile_orphaned_slurm_runs(instance, slurm, heartbeat_timeout=600)
        assert [(r.scope, r.job_ids, r.run_id) for r in reports] == \
            [("asset", (dead_job,), dead_run.run_id)], reports
        assert "the run is FAILURE" in reports[0].reason and not reports[0].run_marked_failed
        assert reports[0].step_key == "sleeper"
        assert wait_until(lambda: dead_job not in _job_ids(env), 30)
        assert live_job in _job_ids(env), "the live run's job must be kept"
        # the user's shared squeue answer may still list the cancelled job for status_max_age:
        # wait until a tick no longer finds it, so the next report is the live run's alone
        assert wait_until(lambda: reconcile_orphaned_slurm_runs(
            instance, slurm, heartbeat_timeout=600, dry_run=True) == [], 30, interval=1.0)
        assert instance.get_run_by_id(live_run_id).status == dg.DagsterRunStatus.STARTED
        # The live run's step process is SIGKILLed: its heartbeat and the run's events age.
        live.send_signal(signal.SIGKILL)
        live.wait(30)
        reports = wait_until(lambda: reconcile_orphaned_slurm_runs(
            instance, slurm, heartbeat_timeout=5), 60, interval=1.0)
        assert [(r.scope, r.job_ids) for r in reports] == [("asset", (live_job,))], reports
        assert reports[0].run_marked_failed and "no status poll" in reports[0].reason
        assert wait_until(lambda: live_job not in _job_ids(env), 30)
        assert instance.get_run_by_id(live_run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(dead_run.run_id).status == dg.DagsterRunStatus.FAILURE
    finally:
        for proc in (live, dead):
            if proc.poll() is None:
                proc.kill()
        _scancel(env, live_job, dead_job)
        slurm.close()
