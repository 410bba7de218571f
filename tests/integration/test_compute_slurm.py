"""ComputeResource on the dev cluster: real Slurm, real sshd, real Dagster runs."""


import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import (
    PAYLOAD_OK,
    compute,
    logged,
    materialize_one,
    run_logs,
    slurm_resource,
    squeue_names,
    step_failure,
    write_payload,
)

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.devcluster.info import slurm_command
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


@pytest.mark.release_subset
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
        rows = subprocess.run([slurm_command(env, "squeue"), "-h", "-t", "R", "-o", "%i|%j"], capture_output=True,
                              text=True, env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.split()
        ids = [r.split("|")[0] for r in rows if "|dsl-" in r]
        job_id = ids[0] if ids else None
        time.sleep(0.3)
    assert job_id, "the job never started"
    after_running(job_id)
    thread.join(120)
    return outcome["result"]


@pytest.mark.release_subset
def test_cancelled_by_someone_else_is_typed(env, tmp_path):
    payload = write_payload(tmp_path, "sleep.py", "import time; time.sleep(120)\n")
    result = _run_in_background(
        payload, lambda job: subprocess.run([slurm_command(env, "scancel"), job], env={"SLURM_CONF": env["SLURM_CONF"]}),
        env,
    )
    assert "SlurmJobCancelled" in step_failure(result)


# An activation that waits: it writes where the job runs, then waits (at most 60 s) for a
# file 'go' in the job directory, so the job can be cancelled before its payload starts.
SLOW_ACTIVATION = """\
pwd > "$DSLURM_TEST_MARK.tmp" && mv -f "$DSLURM_TEST_MARK.tmp" "$DSLURM_TEST_MARK"
for _i in $(seq 600); do [ -e go ] && break; sleep 0.1; done
"""


def _wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def test_scancel_before_the_payload_starts_is_cancelled_not_completed(env, tmp_path):
    from dagster_slurm.agent import write_file_op

    slurm = slurm_resource(env)
    env_dir = f"{slurm.base_path()}/test-envs/slow-activation-{uuid.uuid4().hex[:8]}"
    mark = Path(env_dir) / "job_dir"
    slurm.agent().run(write_file_op(f"{env_dir}/activate.sh", SLOW_ACTIVATION, makedirs=True))
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    outcome = {}

    def target():
        outcome["result"] = materialize_one(
            payload, compute(env, slurm=slurm, pre_deployed_env_path=env_dir, env_packages=None),
            raise_on_error=False, extra_env={"DSLURM_TEST_MARK": str(mark)},
        )

    thread = threading.Thread(target=target)
    thread.start()
    try:
        job_dir = Path(_wait_until(lambda: (_read(mark) or "").strip(), 90, "the activation"))
        rows = subprocess.run([slurm_command(env, "squeue"), "-h", "-o", "%i|%Z"], capture_output=True, text=True,
                              env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.split()
        (job_id,) = [r.split("|")[0] for r in rows if r.split("|")[1] == str(job_dir)]
        subprocess.run([slurm_command(env, "scancel"), job_id], env={"SLURM_CONF": env["SLURM_CONF"]}, check=True)
        # TERM is the drain signal: the job script records the cancel as a drain...
        _wait_until(lambda: _read(job_dir / "drain_signal") == "TERM\n", 30, "the drain record")
    finally:
        started = (_read(mark) or "").strip()
        if started:
            (Path(started) / "go").touch()
        thread.join(120)
        shutil.rmtree(env_dir, ignore_errors=True)
    # ...and skips the payload with status 0; Slurm's CANCELLED still decides
    assert _read(job_dir / "exit_status") == "0\n"
    result = outcome["result"]
    assert not result.success and not result.get_asset_materialization_events()
    text = step_failure(result)
    assert "SlurmJobCancelled" in text and "state CANCELLED" in text


def test_node_failure_is_typed(env, tmp_path):
    payload = write_payload(tmp_path, "sleep.py", "import time; time.sleep(120)\n")
    conf = {"SLURM_CONF": env["SLURM_CONF"]}

    def fail_node(job_id):
        node = subprocess.run([slurm_command(env, "squeue"), "-h", "-j", job_id, "-o", "%N"], capture_output=True,
                              text=True, env=conf).stdout.strip()
        subprocess.run([slurm_command(env, "scontrol"), "update", f"nodename={node}", "state=down", "reason=test"],
                       env=conf, check=True)
        time.sleep(1)
        subprocess.run([slurm_command(env, "scontrol"), "update", f"nodename={node}", "state=resume"], env=conf)

    result = _run_in_background(payload, fail_node, env)  # jobs are not requeued by default
    assert "SlurmNodeFailure" in step_failure(result)


@pytest.mark.slow
def test_timeout_is_typed(env, tmp_path):
    # written by the job's user on a compute node: in the shared home, not a node's /tmp
    mark = Path(env["SLURM_DEPLOYMENT_BASE_PATH"]) / f"timeout-{uuid.uuid4().hex}"
    payload = write_payload(tmp_path, "sleep.py", """
        import os, pathlib, time
        pathlib.Path(os.environ["DSLURM_TEST_MARK"]).touch()
        time.sleep(300)
    """)

    def walltime_now(job_id: str) -> None:
        # Once the payload runs, its job's time limit goes to 0, as an operator may set it
        # on a running job: Slurm ends it for its walltime (TIMEOUT) at its next time-limit
        # check (every 30 s), not at the first check after the submitted minute.
        _wait_until(mark.exists, 60, "the payload to start")
        subprocess.run([slurm_command(env, "scontrol"), "update", f"jobid={job_id}", "timelimit=0"],
                       env={"SLURM_CONF": env["SLURM_CONF"]}, check=True)

    try:
        result = _run_in_background(payload, walltime_now, env,
                                    extra_slurm_opts={"time_limit": "00:01:00"},
                                    extra_env={"DSLURM_TEST_MARK": str(mark)})
    finally:
        mark.unlink(missing_ok=True)
    assert "SlurmJobTimeout" in step_failure(result)


def test_job_over_partition_maxtime_fails_within_a_minute_saying_why(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    start = time.monotonic()
    # a grace of 1 s instead of the default 10: Slurm gives the reason at once and for good
    result = materialize_one(payload, compute(env, pending_grace_seconds=1.0),
                             raise_on_error=False, extra_slurm_opts={"time_limit": "03:00:00"})
    elapsed = time.monotonic() - start
    text = step_failure(result)
    assert "SlurmJobUnschedulable" in text and "PartitionTimeLimit" in text and "time_limit" in text
    assert elapsed < 60
    assert not squeue_names(env), "the unschedulable job must be cancelled"


@pytest.mark.release_subset
def test_pending_job_logs_its_reason_while_it_waits(env, tmp_path, slurm_cluster):
    conf = {"SLURM_CONF": env["SLURM_CONF"]}
    blocker = subprocess.run(
        # from /, with no output file: this process's working directory (a clone under /tmp,
        # as in CI) does not exist on the nodes, which have their own /tmp
        [slurm_command(env, "sbatch"), "--parsable", "-p", "cpu", "-N", "2", "--exclusive", "-J", "blocker",
         "--chdir=/", "--output=/dev/null", "--wrap", "sleep 120"],
        capture_output=True, text=True, env=conf, check=True,
    ).stdout.strip()
    try:
        # the premise: the blocker holds every cpu node (a previous test's job may still be
        # ending on one of them)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and subprocess.run(
                [slurm_command(env, "squeue"), "-h", "-j", blocker, "-o", "%T"], capture_output=True, text=True,
                env=conf).stdout.strip() != "RUNNING":
            time.sleep(0.3)
        payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
        logs: list = []
        instance = dg.DagsterInstance.ephemeral()
        # the job cannot run while the blocker holds every cpu node
        thread = threading.Thread(target=lambda: logs.append(
            materialize_one(payload, compute(env, pending_log_interval=1.0), instance=instance)))
        thread.start()
        # Slurm gives a new job its reason at its next scheduling pass: release the blocker
        # once the step has logged the reason (or the deadline passed; the assert says so)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not logged(
                instance, "waiting in the queue: reason Resources"):
            time.sleep(0.3)
        subprocess.run([slurm_command(env, "scancel"), blocker], env=conf)
        thread.join(120)
        result = logs[0]
        assert result.success
        texts = run_logs(result)
        assert any("waiting in the queue: reason Resources" in t for t in texts), texts
    finally:
        subprocess.run([slurm_command(env, "scancel"), blocker], env=conf)


#: Log messages of the cut-connection test: about 450 KB of messages, enough to keep the
#: step busy for seconds after the cut; the rate of 20,000 messages is measured by
#: benchmarks/bench_compute.py.
FLOOD_LOGS = 4000


def _cut_once_messages_flow(transport, bytes_before: int, stop: threading.Event) -> None:
    """Drop the connection once 100 KB more came back than ``bytes_before`` (the first of the
    payload's messages were read), or after 120 s (then the test's assert says so)."""
    deadline = time.monotonic() + 120
    while not stop.is_set() and time.monotonic() < deadline:
        if transport.stats.bytes_received - bytes_before >= 100_000:
            transport.drop_connection_for_test()
            return
        stop.wait(0.05)


def test_pipes_logs_and_100_materializations_survive_a_cut_connection(env, tmp_path):
    payload = write_payload(tmp_path, "flood.py", f"""
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            for i in range({FLOOD_LOGS}):
                pipes.log.info(f"msg {{i}}")
            for i in range(100):
                pipes.report_asset_materialization(asset_key=f"m{{i}}", metadata={{"i": i}})
    """)
    resource = compute(env)
    connects = {}

    @dg.multi_asset(specs=[dg.AssetSpec(f"m{i}") for i in range(100)])
    def flood(context: dg.AssetExecutionContext, compute: ComputeResource):
        transport = compute.slurm.ssh.get_transport()
        before = transport.stats.connects
        stop = threading.Event()
        cutter = threading.Thread(target=_cut_once_messages_flow,
                                  args=(transport, transport.stats.bytes_received, stop))
        cutter.start()
        try:
            yield from compute.run(context=context, payload_path=payload).get_results()
        finally:
            stop.set()
            cutter.join()
            connects["extra"] = transport.stats.connects - before

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([flood], resources={"compute": resource}, instance=instance)
    assert result.success
    assert connects["extra"] >= 1, "the connection was not cut mid-stream"
    logs = [e.user_message for e in instance.all_logs(result.run_id)
            if e.user_message.startswith("msg ")]
    assert logs == [f"msg {i}" for i in range(FLOOD_LOGS)]
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


def _our_ssh_connections(port: int) -> set[str]:
    """Local addresses of the established SSH connections this test process holds."""
    lines = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    mine = f"pid={os.getpid()},"
    return {line.split()[2] for line in lines if mine in line}


def _sshd_of_other_logins(port: int, ours: set[str]) -> set[int]:
    """Pids of the sshd processes serving SSH connections that this test process does not
    hold (other logins of the submitter), where this network namespace shows them."""
    lines = subprocess.run(["ss", "-Htnp", "state", "established", f"( sport = :{port} )"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    pids: set[int] = set()
    for line in lines:
        parts = line.split()
        if len(parts) > 3 and parts[3] not in ours:
            pids.update(int(p) for p in re.findall(r"pid=(\d+)", line))
    return pids


def _parent(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _descends_from(pid: int, roots: set[int]) -> bool:
    while pid > 1:
        if pid in roots:
            return True
        pid = _parent(pid)
    return False


def _ticks_since_boot() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _processes_started_since(user: str, ticks: int, others: set[int]) -> list[str]:
    """Live (non-zombie) processes of ``user`` started after ``ticks`` (clock ticks since
    boot) and not under one of the sshd processes ``others``: what a run of this test can
    have left behind, whatever else ``user`` runs."""
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, started = fields[0], int(fields[19])
        if state != "Z" and started >= ticks and not _descends_from(int(proc.name), others):
            found.append(f"{proc.name}: {cmdline.strip()}")
    return sorted(found)


def test_no_process_or_channel_left_after_ten_runs(env, tmp_path, slurm_cluster):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    # Only what this test starts counts: connections of this process opened during the
    # runs, and processes of the submitter started during the runs. Other logins of the
    # submitter, and a previous test's connection still closing, are not ours.
    connections_before = _our_ssh_connections(slurm_cluster.port)
    started = _ticks_since_boot()
    for _ in range(10):
        assert materialize_one(payload, compute(env)).success

    def leftovers():
        ours = _our_ssh_connections(slurm_cluster.port)
        others = _sshd_of_other_logins(slurm_cluster.port, ours)
        return (sorted(ours - connections_before),
                _processes_started_since(slurm_cluster.user, started, others))

    deadline = time.monotonic() + 15
    while leftovers() != ([], []) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers() == ([], [])


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


def test_a_finished_run_does_not_close_the_connection_under_a_concurrent_one(
        env, tmp_path, slurm_cluster):
    """Teardown is reference-counted per process: runs in threads share one connection."""
    quick = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    # the slow payload runs until the quick run has ended (the file, which every node sees,
    # is written then), at most 60 s
    release = Path(slurm_cluster.deployment_base_path) / f"release-{uuid.uuid4().hex[:8]}"
    slow = write_payload(tmp_path, "slow.py", f"""
        import os, time
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            deadline = time.monotonic() + 60
            while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:
                time.sleep(0.1)
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
            quick, resource, raise_on_error=False, name="quick_asset")), release.write_text(""))),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        release.write_text("")  # the slow payload ends even when the quick run raised
        release.unlink()
    assert results["quick"].success
    assert results["slow"].success, step_failure(results["slow"])
    assert transport.stats.connects - logins_before == 1, (
        "the quick run's teardown closed the connection the slow run was using"
    )
