"""ComputeResource on the dev cluster: real Slurm, real sshd, real Dagster runs."""


import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from compute_support import (
    PAYLOAD_OK,
    compute,
    materialize_one,
    run_logs,
    slurm_resource,
    squeue_names,
    step_failure,
    write_payload,
)

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.launchers.bash import BashLauncher

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def test_same_asset_in_local_and_slurm_mode_has_identical_metadata_keys(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    keys = {}
    for mode in ("local", "slurm"):
        result = materialize_one(payload, compute(env, mode))
        assert result.success
        (event,) = result.get_asset_materialization_events()
        metadata = event.materialization.metadata
        assert metadata["rows"].value == 42
        keys[mode] = set(metadata)
        assert metadata["dagster_slurm/mode"].value == mode
    assert keys["local"] == keys["slurm"]


def test_extras_logs_and_output_reach_dagster(env, tmp_path, capfd):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    result = materialize_one(payload, compute(env))
    assert any("extras={'answer': 42}" in m for m in run_logs(result))
    out, err = capfd.readouterr()
    assert "payload stdout" in out and "payload stderr" in err


def test_nonzero_exit_is_typed_with_tails(env, tmp_path):
    payload = write_payload(tmp_path, "fail.py", """
        import sys
        print("about to fail")
        print("Traceback: something broke", file=sys.stderr)
        sys.exit(3)
    """)
    result = materialize_one(payload, compute(env), raise_on_error=False)
    text = step_failure(result)
    assert "SlurmJobNonZeroExit" in text and "exit code 3" in text
    assert "something broke" in text and "about to fail" in text


def test_out_of_memory_is_typed(env, tmp_path):
    payload = write_payload(tmp_path, "oom.py", """
        import time
        block = bytearray(700 * 1024 * 1024)
        time.sleep(20)
    """)
    result = materialize_one(payload, compute(env), raise_on_error=False,
                             extra_slurm_opts={"mem": "200M"})
    assert "SlurmJobOutOfMemory" in step_failure(result)


def test_sbatch_rejection_is_typed_with_slurms_message(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    result = materialize_one(payload, compute(env), raise_on_error=False,
                             extra_slurm_opts={"partition": "nosuchpartition"})
    text = step_failure(result)
    assert "SlurmSubmissionError" in text and "nvalid partition" in text


def _run_in_background(payload: str, after_running, env, **opts):
    """Materialize in a thread; ``after_running(job_id)`` is called once the job runs."""
    outcome = {}

    def target():
        outcome["result"] = materialize_one(payload, compute(env), raise_on_error=False, **opts)

    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + 60
    job_id = None
    while time.monotonic() < deadline and job_id is None:
        rows = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i|%j"], capture_output=True,
                              text=True, env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.split()
        ids = [r.split("|")[0] for r in rows if "|dsl-" in r]
        job_id = ids[0] if ids else None
        time.sleep(0.3)
    assert job_id, "the job never started"
    after_running(job_id)
    thread.join(120)
    return outcome["result"]


def test_cancelled_by_someone_else_is_typed(env, tmp_path):
    payload = write_payload(tmp_path, "sleep.py", "import time; time.sleep(120)\n")
    result = _run_in_background(
        payload, lambda job: subprocess.run(["scancel", job], env={"SLURM_CONF": env["SLURM_CONF"]}),
        env,
    )
    assert "SlurmJobCancelled" in step_failure(result)


def test_node_failure_is_typed(env, tmp_path):
    payload = write_payload(tmp_path, "sleep.py", "import time; time.sleep(120)\n")
    conf = {"SLURM_CONF": env["SLURM_CONF"]}

    def fail_node(job_id):
        node = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True,
                              text=True, env=conf).stdout.strip()
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test"],
                       env=conf, check=True)
        time.sleep(1)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=conf)

    result = _run_in_background(payload, fail_node, env, extra_slurm_opts={"extra_sbatch_directives": ["--no-requeue"]})
    assert "SlurmNodeFailure" in step_failure(result)


@pytest.mark.slow
def test_timeout_is_typed(env, tmp_path):
    payload = write_payload(tmp_path, "sleep.py", "import time; time.sleep(300)\n")
    result = materialize_one(payload, compute(env), raise_on_error=False,
                             extra_slurm_opts={"time_limit": "00:01:00"})
    assert "SlurmJobTimeout" in step_failure(result)


def test_job_over_partition_maxtime_fails_within_a_minute_saying_why(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    start = time.monotonic()
    result = materialize_one(payload, compute(env), raise_on_error=False,
                             extra_slurm_opts={"time_limit": "03:00:00"})
    elapsed = time.monotonic() - start
    text = step_failure(result)
    assert "SlurmJobUnschedulable" in text and "PartitionTimeLimit" in text and "time_limit" in text
    assert elapsed < 60
    assert not squeue_names(env), "the unschedulable job must be cancelled"


def test_pending_job_logs_its_reason_while_it_waits(env, tmp_path, slurm_cluster):
    conf = {"SLURM_CONF": env["SLURM_CONF"]}
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-p", "cpu", "-N", "2", "--exclusive", "-J", "blocker",
         "--wrap", "sleep 120"], capture_output=True, text=True, env=conf, check=True,
    ).stdout.strip()
    try:
        payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
        logs: list = []
        # the job cannot run while the blocker holds every cpu node
        thread = threading.Thread(target=lambda: logs.append(
            materialize_one(payload, compute(env, pending_log_interval=1.0))))
        thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("PENDING" in r for r in squeue_names(env)):
            time.sleep(0.3)
        time.sleep(3)  # a few polls while it waits
        subprocess.run(["scancel", blocker], env=conf)
        thread.join(120)
        result = logs[0]
        assert result.success
        texts = run_logs(result)
        assert any("waiting in the queue: reason Resources" in t for t in texts), texts
    finally:
        subprocess.run(["scancel", blocker], env=conf)


def test_pipes_20000_logs_and_100_materializations_survive_a_cut_connection(env, tmp_path):
    payload = write_payload(tmp_path, "flood.py", """
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            for i in range(20000):
                pipes.log.info(f"msg {i}")
            for i in range(100):
                pipes.report_asset_materialization(asset_key=f"m{i}", metadata={"i": i})
    """)
    resource = compute(env)
    connects = {}

    @dg.multi_asset(specs=[dg.AssetSpec(f"m{i}") for i in range(100)])
    def flood(context: dg.AssetExecutionContext, compute: ComputeResource):
        transport = compute.slurm.ssh.get_transport()
        before = transport.stats.connects
        cutter = threading.Timer(2.0, transport.drop_connection_for_test)
        cutter.start()
        try:
            yield from compute.run(context=context, payload_path=payload).get_results()
        finally:
            cutter.cancel()
            connects["extra"] = transport.stats.connects - before

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([flood], resources={"compute": resource}, instance=instance)
    assert result.success
    assert connects["extra"] >= 1, "the connection was not cut mid-stream"
    logs = [e.user_message for e in instance.all_logs(result.run_id)
            if e.user_message.startswith("msg ")]
    assert logs == [f"msg {i}" for i in range(20000)]
    mats = result.get_asset_materialization_events()
    assert sorted(int(e.materialization.metadata["i"].value) for e in mats) == list(range(100))


def test_run_termination_leaves_no_job(env, tmp_path):
    payload = write_payload(tmp_path, "sleep.py", "import time; time.sleep(300)\n")
    script = write_payload(tmp_path, "run.py", f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from compute_support import compute, materialize_one
        import os
        env = dict(os.environ)
        materialize_one({payload!r}, compute(env), raise_on_error=False)
    """)
    proc = subprocess.Popen([sys.executable, script], env={**os.environ, **env})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("RUNNING" in r for r in squeue_names(env)):
        time.sleep(0.3)
    assert squeue_names(env), "the job never started"
    proc.send_signal(signal.SIGINT)  # what `dagster` run termination delivers to the step
    proc.wait(60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and squeue_names(env):
        time.sleep(0.5)
    assert not [r for r in squeue_names(env) if "RUNNING" in r or "PENDING" in r]


def test_bad_input_fails_before_submission(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    with pytest.raises(Exception, match="unknown_field"):
        BashLauncher(unknown_field=1)
    for opts, needle in [
        ({"time_limit": "-5"}, "time_limit"),
        ({"partition": "cpu; touch /tmp/pwned"}, "partition"),
        ({"gpu": 1}, "extra_slurm_opts"),
    ]:
        result = materialize_one(payload, compute(env), raise_on_error=False, extra_slurm_opts=opts)
        assert needle in step_failure(result)
    result = materialize_one(payload, compute(env), raise_on_error=False,
                             extra_env={"A;touch /tmp/pwned": "x"})
    assert "extra_env" in step_failure(result)
    assert not squeue_names(env)


def test_hostile_env_value_reaches_the_payload_literally(env, tmp_path):
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker}) `touch {marker}`; touch {marker} '\""
    payload = write_payload(tmp_path, "echo.py", """
        import os
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            pipes.report_asset_materialization(metadata={"value": os.environ["HOSTILE"]})
    """)
    result = materialize_one(payload, compute(env), extra_env={"HOSTILE": hostile})
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["value"].value == hostile
    assert not marker.exists()


def test_no_process_or_channel_left_after_ten_runs(env, tmp_path, slurm_cluster):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)

    def census():
        """Live processes of the submitter (zombies excluded) and open SSH connections."""
        ps = subprocess.run(["ps", "-u", slurm_cluster.user, "-o", "stat=,args="],
                            capture_output=True, text=True).stdout.splitlines()
        live = sorted(line.split(None, 1)[1] for line in ps if not line.strip().startswith("Z"))
        ssh = subprocess.run(["ss", "-Htn", "state", "established", f"( dport = :{slurm_cluster.port} )"],
                             capture_output=True, text=True).stdout.splitlines()
        return live, len(ssh)

    before = census()
    for _ in range(10):
        assert materialize_one(payload, compute(env)).success
    time.sleep(1)
    assert census() == before


def test_completion_detected_without_accounting(env, tmp_path, slurm_cluster):
    """sacct failing (slurmdbd down): completion and exit code still come within a poll."""
    from dagster_slurm.devcluster import DevCluster

    cluster = DevCluster(state_dir=slurm_cluster.state_dir)
    pid_file = Path(slurm_cluster.state_dir) / "run" / "slurmdbd.pid"
    os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
    time.sleep(1)
    try:
        payload = write_payload(tmp_path, "fail.py", "import sys; sys.exit(5)\n")
        start = time.monotonic()
        result = materialize_one(payload, compute(env), raise_on_error=False)
        assert "exit code 5" in step_failure(result)
        assert time.monotonic() - start < 30
    finally:
        cluster.up()


def test_slurm_resource_queue_partition_override(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    resource = compute(env, slurm=slurm_resource(env, partition="gpu"))
    result = materialize_one(payload, resource)
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["dagster_slurm/nodes"].value in ("g1", "g2", None)


def test_a_finished_run_does_not_close_the_connection_under_a_concurrent_one(env, tmp_path):
    """Teardown is reference-counted per process: runs in threads share one connection."""
    quick = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    slow = write_payload(tmp_path, "slow.py", """
        import time
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            time.sleep(6)
            pipes.log.info("slow payload done")
    """)
    results = {}
    resource = compute(env)
    transport = resource.slurm.ssh.get_transport()
    transport.close()
    logins_before = transport.stats.connects
    threads = [
        threading.Thread(target=lambda: results.__setitem__("slow", materialize_one(
            slow, resource, raise_on_error=False, name="slow_asset"))),
        threading.Thread(target=lambda: (time.sleep(1), results.__setitem__("quick", materialize_one(
            quick, resource, raise_on_error=False, name="quick_asset")))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results["quick"].success
    assert results["slow"].success, step_failure(results["slow"])
    assert transport.stats.connects - logins_before == 1, (
        "the quick run's teardown closed the connection the slow run was using"
    )
