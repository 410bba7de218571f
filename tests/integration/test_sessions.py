"""Run-scoped allocations on the dev cluster: real Slurm, real Dagster runs, real Ray.

What is shown: one allocation and one Ray cluster for a run of four assets under the
multiprocess executor; one allocation for eight processes starting at once; shape
mismatches refused before submission; teardown after success, failure and termination;
the orphan sensor after a SIGKILLed run process; the allocation's own dead-man's switch.
"""

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import (
    materialize_one,
    run_logs,
    slurm_resource,
    step_failure,
    write_payload,
)
from session_support import (
    FLAKY_PAYLOAD,
    RAY_SESSION_PAYLOAD,
    Toucher,
    accounted_jobs,
    active_jobs,
    diamond_job,
    retry_job,
    session_compute,
)

from dagster_slurm import (
    ComputeResource,
    SlurmAllocationEnded,
    SlurmRunAllocationConfig,
    SlurmSessionResource,
    SlurmStepFailed,
    build_slurm_orphan_reconcile_sensor,
)
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.session import RunSession

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).parent
PAYLOAD_OK = """
import os
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"slurm_job_id": os.environ["SLURM_JOB_ID"]})
"""


#: The dead-man's switch limit of the heartbeat tests, in seconds: the shortest the library
#: accepts (with allow_short_heartbeat_timeout), five beats of 1 s.
SHORT_HEARTBEAT_LIMIT = 5


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def wait_until(predicate, timeout: float, interval: float = 0.5):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def metadata(result) -> dict[str, dict[str, object]]:  # noqa: ANN001
    """asset name -> its materialization metadata (plain values)."""
    out = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        out[mat.asset_key.path[-1]] = {k: v.value for k, v in mat.metadata.items()}
    return out


@pytest.mark.slow
def test_four_ray_assets_share_one_allocation_and_one_ray_cluster(env, tmp_path, monkeypatch):
    payload = write_payload(tmp_path, "ray_session.py", RAY_SESSION_PAYLOAD)
    # left and right wait for each other in their payloads: on the shared filesystem
    meet_dir = Path(env["SLURM_DEPLOYMENT_BASE_PATH"]) / f"meet-{uuid.uuid4().hex}"
    for key, value in {**env, "DSLURM_TEST_SESSION": "ray", "DSLURM_TEST_PAYLOAD": payload,
                       "MEET_STEPS": "left,right", "MEET_DIR": str(meet_dir),
                       "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
                       }.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(HERE)  # step processes import session_support from the working directory
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        try:
            result = dg.execute_job(dg.reconstructable(diamond_job), instance=instance)
        finally:
            shutil.rmtree(meet_dir, ignore_errors=True)
        assert result.success
        meta = metadata(result)
        run_id = result.run_id
        records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_START).records
        step_pids = {r.event_log_entry.dagster_event.pid for r in records}
        logs = [entry.user_message for entry in instance.all_logs(run_id)]
    assert sorted(meta) == ["first", "last", "left", "right"]
    assert len(step_pids) == 4, "each step ran in its own process"
    assert len({m["slurm_job_id"] for m in meta.values()}) == 1
    assert len({m["gcs_address"] for m in meta.values()}) == 1, meta
    assert len({m["slurm_step_id"] for m in meta.values()}) == 4, "each asset is its own job step"
    assert all(m["total"] == 14 for m in meta.values())
    submitted = [m for m in logs if m.startswith("Submitted run allocation")]
    assert len(submitted) == 1, submitted
    assert any("kept for the run's other steps" in m for m in logs)
    assert any("every step of the run has finished" in m for m in logs), "last teardown did not cancel"
    left, right = meta["left"]["window"], meta["right"]["window"]
    assert left[0] < right[1] and right[0] < left[1], "left and right did not overlap"
    prefix = f"dsr-{run_id}"
    assert wait_until(lambda: accounted_jobs(env, prefix), 20) == [meta["first"]["slurm_job_id"]]
    assert wait_until(lambda: not active_jobs(env, prefix), 30)


def test_retried_step_reattaches_to_the_live_allocation(env, tmp_path, monkeypatch):
    payload = write_payload(tmp_path, "flaky.py", FLAKY_PAYLOAD)
    # written by the job's user on a compute node: in the shared home, not a node's /tmp
    marker = Path(env["SLURM_DEPLOYMENT_BASE_PATH"]) / f"flaky-{uuid.uuid4().hex}"
    for key, value in {**env, "DSLURM_TEST_SESSION": "bash", "DSLURM_TEST_PAYLOAD": payload,
                       "FLAKY_MARKER": str(marker)}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(HERE)
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        result = dg.execute_job(dg.reconstructable(retry_job), instance=instance)
        assert result.success
        logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
        records = instance.get_records_for_run(
            result.run_id,
            of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_RESTARTED},
        ).records
        pids = {r.event_log_entry.dagster_event.pid for r in records}
    assert marker.exists() and len(pids) == 2, "the retry ran in a second process"
    assert len([m for m in logs if m.startswith("Submitted run allocation")]) == 1, logs
    assert any("found; attaching to it" in m for m in logs), logs
    job_id = metadata(result)["flaky"]["slurm_job_id"]
    requested = [m for m in logs if m.startswith("Step flaky requested in run allocation")]
    assert len(requested) == 2 and all(f"allocation {job_id};" in m for m in requested), requested
    assert wait_until(lambda: not active_jobs(env, f"dsr-{result.run_id}"), 30)
    marker.unlink()


def _ensure_at_barrier(env: dict, run_id: str, barrier, results) -> None:  # noqa: ANN001
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    slurm = slurm_resource(env)
    session = RunSession(
        slurm, run_id, SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5),
        BashLauncher(), activation=lambda: None,
    )
    slurm.agent().install()
    barrier.wait()
    try:
        results.put(session.ensure().job_id)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(f"error: {exc!r}")
    finally:
        session.close(cancel=False)
        slurm.close()


def test_eight_processes_starting_at_once_submit_one_allocation(env):
    run_id = str(uuid.uuid4())
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_ensure_at_barrier, args=(env, run_id, barrier, results))
             for _ in range(8)]
    for proc in procs:
        proc.start()
    try:
        job_ids = [results.get(timeout=180) for _ in procs]
    finally:
        for proc in procs:
            proc.join(60)
    assert len(set(job_ids)) == 1 and not job_ids[0].startswith("error"), job_ids
    prefix = f"dsr-{run_id}"
    assert [row[0] for row in active_jobs(env, prefix)] == job_ids[:1]
    subprocess.run([slurm_command(env, "scancel"), f"--name={active_jobs(env, prefix)[0][1]}"], check=True,
                   env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"})
    assert wait_until(lambda: accounted_jobs(env, prefix), 20) == job_ids[:1]


def test_shape_mismatch_fails_before_submission(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    compute = session_compute("bash", env, num_nodes=1, mem="500M")
    result = materialize_one(payload, compute, raise_on_error=False,
                             extra_slurm_opts={"nodes": 2, "mem": "500M"})
    text = step_failure(result)
    assert "extra_slurm_opts" in text and "num_nodes" in text and "mem" not in text.split("(")[1].split(":")[0]
    assert "the run allocation has 1" in text
    assert not active_jobs(env, f"dsr-{result.run_id}")
    assert not list(Path(env["SLURM_DEPLOYMENT_BASE_PATH"], "sessions").glob(f"{result.run_id}*"))


def test_unschedulable_run_allocation_fails_with_the_reason_and_is_cancelled(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    # MaxTime is 02:00:00; a grace of 1 s instead of the default 10: the reason is for good
    compute = session_compute("bash", env, resource_options={"pending_grace_seconds": 1.0},
                              time_limit="03:00:00")
    start = time.monotonic()
    result = materialize_one(payload, compute, raise_on_error=False)
    text = step_failure(result)
    assert "SlurmJobUnschedulable" in text and "PartitionTimeLimit" in text, text
    assert time.monotonic() - start < 60
    logs = run_logs(result)
    assert any("waiting in the queue" in m and "PartitionTimeLimit" in m for m in logs), logs
    assert wait_until(lambda: not active_jobs(env, f"dsr-{result.run_id}"), 20)


def test_teardown_after_success_and_failure_leaves_no_job(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    failing = write_payload(tmp_path, "fail.py", "import sys; sys.exit(3)\n")
    compute = session_compute("bash", env)

    @dg.asset
    def one(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    @dg.asset(deps=[one])
    def two(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    result = dg.materialize([one, two], resources={"compute": compute})
    assert result.success
    meta = metadata(result)
    job = meta["one"]["slurm_job_id"]
    assert meta["two"]["slurm_job_id"] == job
    # each step's figures are its own job step's: <allocation>.<step>, on the head node
    steps = {meta[name]["dagster_slurm/job_id"] for name in ("one", "two")}
    assert len(steps) == 2 and all(s.startswith(f"{job}.") and s.split(".")[1].isdigit() for s in steps)
    heads = {meta[name]["dagster_slurm/nodes"] for name in ("one", "two")}
    assert len(heads) == 1 and heads <= {"c1", "c2"}, heads
    assert meta["one"]["dagster_slurm/state"] == "COMPLETED"
    assert wait_until(lambda: not active_jobs(env, f"dsr-{result.run_id}"), 20)

    @dg.asset
    def broken(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=failing).get_results()

    result = dg.materialize([broken], resources={"compute": compute}, raise_on_error=False)
    assert not result.success
    text = step_failure(result)
    assert "SlurmStepFailed" in text and "exit code 3" in text
    assert wait_until(lambda: not active_jobs(env, f"dsr-{result.run_id}"), 20)


def test_session_resource_and_deferred_cleanup(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    env_kwargs = ({"pre_deployed_env_path": os.environ["DAGSTER_SLURM_TEST_ENV_PATH"]}
                  if os.environ.get("DAGSTER_SLURM_TEST_ENV_PATH") else {"env_packages": ["dagster-pipes"]})
    explicit_session = SlurmSessionResource(slurm=slurm_resource(env), **env_kwargs)
    seen: dict[str, object] = {}

    @dg.asset
    def deferred(context: dg.AssetExecutionContext, compute: ComputeResource):
        invocation = compute.run(context=context, payload_path=payload, defer_cleanup=True)
        session = compute.get_run_allocation_session(context)
        step_dir = Path(session.paths.steps_dir(session.allocation.job_id)) / "deferred"
        seen["kept"] = sorted(p.name for p in next(step_dir.iterdir()).iterdir())
        compute.cleanup_deferred_run_dir(context)
        seen["after_cleanup"] = step_dir.exists()
        yield from invocation.get_results()

    @dg.asset
    def explicit(context: dg.AssetExecutionContext, session: SlurmSessionResource):
        result = session.execute_in_session(context, "hostname")
        allocation = session.allocation(context)
        return dg.MaterializeResult(metadata={
            "exit_code": result.exit_code, "host": result.stdout_tail.strip(),
            "job_id": allocation.job_id, "nodes": list(allocation.nodes),
        })

    result = dg.materialize([deferred, explicit], resources={
        "compute": session_compute("bash", env), "session": explicit_session})
    assert result.success
    assert "pipes_messages.jsonl" in seen["kept"] and "exit_status" in seen["kept"], seen
    assert seen["after_cleanup"] is False
    meta = metadata(result)
    assert meta["explicit"]["exit_code"] == 0
    assert meta["explicit"]["host"] in meta["explicit"]["nodes"]
    assert meta["explicit"]["job_id"] != meta["deferred"]["slurm_job_id"], "two configurations"
    assert wait_until(lambda: not active_jobs(env, f"dsr-{result.run_id}"), 30)


def _run_script(tmp_path: Path, body: str) -> str:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
    """) + textwrap.dedent(body))
    return str(script)


SLEEP_RUN = """
    import os
    import dagster as dg
    from session_support import session_compute
    from dagster_slurm import ComputeResource

    @dg.asset
    def sleeper(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path="sleep 600").get_results()

    instance = dg.DagsterInstance.local_temp(tempdir=os.environ["DSLURM_TEST_HOME"])
    dg.materialize([sleeper], resources={"compute": session_compute("bash")}, instance=instance,
                   raise_on_error=False)
"""


def _start_sleeping_run(env: dict[str, str], tmp_path: Path, **extra: str) -> tuple[subprocess.Popen, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, _run_script(tmp_path, SLEEP_RUN)],
        env={**os.environ, **env, "DSLURM_TEST_HOME": str(home), **extra},
    )
    before = time.monotonic()
    known = {row[0] for row in active_jobs(env, "dsr-")}
    running = wait_until(lambda: [r for r in active_jobs(env, "dsr-")
                                  if r[2] == "RUNNING" and r[0] not in known], 90)
    assert running, "the run allocation never started"
    # the step has started once its invocation directory exists
    job_id = running[0][0]
    assert wait_until(lambda: list(Path(env["SLURM_DEPLOYMENT_BASE_PATH"], "sessions").glob(
        f"*/jobs/{job_id}/steps/sleeper/*/stdout.log")), 60)
    assert time.monotonic() - before < 150
    return proc, running[0][1]


def test_run_termination_cancels_the_allocation(env, tmp_path):
    proc, name = _start_sleeping_run(env, tmp_path)
    proc.send_signal(signal.SIGINT)  # what run termination delivers to the step
    proc.wait(60)
    assert wait_until(lambda: not active_jobs(env, name), 30), active_jobs(env, name)


@pytest.mark.slow
def test_orphan_sensor_cancels_allocation_and_fails_run_after_sigkill(env, tmp_path):
    proc, name = _start_sleeping_run(
        env, tmp_path, DSLURM_TEST_HEARTBEAT_INTERVAL="1", DSLURM_TEST_HEARTBEAT_TIMEOUT="600",
    )
    proc.kill()
    proc.wait(30)
    instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "home"))
    (run,) = instance.get_runs()
    assert run.status == dg.DagsterRunStatus.STARTED
    sensor = build_slurm_orphan_reconcile_sensor(slurm=slurm_resource(env), heartbeat_timeout=5)
    # A fresh heartbeat keeps the session alive: the first evaluation must not touch it.
    first = sensor(dg.build_sensor_context(instance=instance))
    assert "no orphaned" in first.skip_message
    assert active_jobs(env, name)
    time.sleep(6)
    second = sensor(dg.build_sensor_context(instance=instance))
    assert f"run {run.run_id}: cancelled" in second.skip_message, second.skip_message
    assert wait_until(lambda: not active_jobs(env, name), 30)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


@pytest.mark.slow
def test_allocation_cancels_itself_without_heartbeat(env, tmp_path):
    proc, name = _start_sleeping_run(
        env, tmp_path, DSLURM_TEST_HEARTBEAT_INTERVAL="1",
        DSLURM_TEST_HEARTBEAT_TIMEOUT=str(SHORT_HEARTBEAT_LIMIT),
    )
    job_id = active_jobs(env, name)[0][0]
    time.sleep(1.5 * SHORT_HEARTBEAT_LIMIT)
    assert active_jobs(env, name), "heartbeats of the live supervisor must keep it"
    killed_at = time.monotonic()
    proc.kill()
    proc.wait(30)
    assert wait_until(lambda: not active_jobs(env, name), 60), active_jobs(env, name)
    took = time.monotonic() - killed_at
    assert SHORT_HEARTBEAT_LIMIT - 2 <= took <= 40, took
    (marker,) = Path(env["SLURM_DEPLOYMENT_BASE_PATH"], "sessions").glob(f"*/jobs/{job_id}/ended_by")
    assert marker.read_text().strip() == "heartbeat"


@pytest.mark.slow
def test_dead_mans_switch_judges_heartbeat_content_not_mtime(env):
    slurm = slurm_resource(env)
    config = SlurmRunAllocationConfig(heartbeat_timeout=SHORT_HEARTBEAT_LIMIT,
                                      heartbeat_interval=1, allow_short_heartbeat_timeout=True)
    session = RunSession(slurm, str(uuid.uuid4()), config, BashLauncher(), activation=lambda: None)
    heartbeat = session.paths.heartbeat
    try:
        job_id = session.allocation.job_id  # running, accepting steps, beating every second
        ended_by = Path(session.paths.session_dir) / "jobs" / job_id / "ended_by"
        # Fresh content, stale mtime: twice the limit later the allocation is still there.
        stale_mtimes, contents = 0, set()
        with Toucher(heartbeat, "1 hour ago"):
            end = time.monotonic() + 2 * SHORT_HEARTBEAT_LIMIT + 2
            while time.monotonic() < end:
                assert active_jobs(env, session.job_name), "a live supervisor's allocation ended"
                stale_mtimes += os.stat(heartbeat).st_mtime < time.time() - 3000
                contents.add(Path(heartbeat).read_text())
                time.sleep(0.5)
        assert stale_mtimes > 10 and len(contents) > 5, (stale_mtimes, contents)
        assert not ended_by.exists()
        # Stale content, fresh mtime: no process beats any more, the file is only touched.
        session.close(cancel=False)
        with Toucher(heartbeat, "now"):
            assert wait_until(lambda: not active_jobs(env, session.job_name), 60), \
                "unchanged heartbeat content must end the allocation"
        assert ended_by.read_text().strip() == "heartbeat"
    finally:
        session.close(cancel=True)
        slurm.close()


def test_reconcile_prunes_sessions_closed_long_ago(env):
    from dagster_slurm.state.schema import new_session_document
    from dagster_slurm.state.store import AgentStateStore

    slurm = slurm_resource(env)
    root = Path(env["SLURM_DEPLOYMENT_BASE_PATH"], "sessions")
    try:
        names = {}
        for age, label in ((3600.0, "old"), (10.0, "recent")):
            run_id = f"prune-{label}-{uuid.uuid4().hex[:8]}"
            session_dir = f"{slurm.base_path()}/sessions/{run_id}"
            store = AgentStateStore(slurm.agent(), session_dir,
                                    initial=new_session_document(f"dsr-{run_id}", run_id))
            store.transact([{"op": "add", "path": "/closed_at", "value_now": -age}])
            names[label] = run_id
        reconcile = build_slurm_orphan_reconcile_sensor(slurm=slurm, prune_closed_after=600)
        reconcile(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
        assert not (root / names["old"]).exists()
        assert (root / names["recent"] / "allocation.json").exists()
    finally:
        slurm.close()
        for run_id in names.values():
            shutil.rmtree(root / run_id, ignore_errors=True)


def test_lower_level_allocation_api(env):
    slurm = slurm_resource(env)
    session = RunSession(
        slurm, str(uuid.uuid4()), SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5),
        BashLauncher(), activation=lambda: None,
    )
    try:
        allocation = session.allocation  # the name of dagster-slurm 1.x: it submits and waits
        assert session.ensure() is allocation and session.current_allocation() is allocation
        assert allocation.nodes and allocation.ray_address is None
        end = allocation.query_end_time()
        assert end is not None and "T" in end and allocation.end_time == end
        ok = session.execute_in_session("hostname", name="host")
        assert ok.exit_code == 0 and not ok.drained
        assert ok.stdout_tail.strip() == allocation.nodes[0]
        with pytest.raises(SlurmStepFailed, match="exit code 4"):
            session.execute_in_session(["bash", "-c", "echo oops >&2; exit 4"], name="fails")
        allocation.request_drain()
        time.sleep(1.5)
        drained = session.execute_in_session(["touch", "/tmp/should-not-exist"], name="late")
        assert drained.drained and drained.drain_signal == "TERM" and drained.exit_code == 0
        assert not Path("/tmp/should-not-exist").exists()
        subprocess.run([slurm_command(env, "scancel"), allocation.job_id], check=True,
                       env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"})
        assert wait_until(lambda: not active_jobs(env, session.job_name), 30)
        with pytest.raises(SlurmAllocationEnded) as info:
            session.execute_in_session(["sleep", "30"], name="orphaned")
        assert info.value.result.allocation_state in ("CANCELLED", "UNKNOWN", "REPLACED")
    finally:
        session.close(cancel=True)
        slurm.close()
    assert wait_until(lambda: not active_jobs(env, session.job_name), 20)
