"""Partitioned assets as job arrays: real Slurm, real Dagster, and the same in local mode.

One single-run backfill of 200 partitions runs as one job array (a pool of processes
locally): every key is processed exactly once (an exclusive-create file per key on the shared
filesystem), never more than ``array_parallelism`` tasks at once, one materialization per
partition with its own metadata; five keys that fail on purpose are named in the step's
error and stay unmaterialized, and a run of just those submits an array of five.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import dagster as dg
import pytest
from arrays_support import PARALLELISM, PAYLOAD, digest, materialize_range, partitioned_asset
from compute_support import compute, step_failure, wait_until, write_payload

from dagster_slurm.devcluster.info import slurm_command

pytestmark = pytest.mark.integration

def _prepare(root: Path) -> None:
    for directory in (root, root / "done", root / "fail"):
        directory.mkdir(exist_ok=True)
        directory.chmod(0o777)


def _done(root: Path) -> dict[str, dict]:
    return {json.loads(p.read_text())["key"]: json.loads(p.read_text())
            for p in (root / "done").iterdir()}


def _most_at_once(records: list[dict]) -> int:
    points = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
                    key=lambda p: (p[0], p[1]))
    running = most = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


def _materialized(instance: dg.DagsterInstance) -> dict[str, dict]:
    records = instance.fetch_materializations(dg.AssetKey("sample"), limit=10_000).records
    found: dict[str, dict] = {}
    for record in records:
        event = record.asset_materialization
        assert event.partition not in found, f"partition {event.partition!r} materialized twice"
        found[event.partition] = {k: v.value for k, v in event.metadata.items()}
    return found


def _sacct_tasks(env: dict[str, str], array_id: str) -> list[str]:
    out = subprocess.run([slurm_command(env, "sacct"), "-n", "-X", "-P", "-o", "JobID", "-j",
                          array_id], capture_output=True, text=True,
                         env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


@pytest.fixture(params=["slurm", "local"])
def mode(request) -> str:
    if request.param == "slurm":
        request.getfixturevalue("slurm_cluster")
    return request.param


@pytest.fixture
def env(mode, request) -> dict[str, str]:
    if mode == "slurm":
        return request.getfixturevalue("slurm_cluster").env()
    return {}


@pytest.fixture
def shared(mode, request, tmp_path) -> Path:
    """A directory the payloads write to: on the cluster one that every node sees and the
    cluster user can write (the nodes have a /tmp of their own)."""
    if mode == "local":
        return tmp_path
    cluster = request.getfixturevalue("slurm_cluster")
    directory = Path(tempfile.mkdtemp(prefix="arrays-", dir=cluster.state_dir))
    directory.chmod(0o777)
    return directory


@pytest.mark.slow
def test_200_partitions_run_once_each_as_one_array_and_failures_are_named(mode, env, shared,
                                                                         tmp_path):
    root = shared / "array"
    _prepare(root)
    keys = [f"sample-{i:03d}" for i in range(200)]
    failing = keys[100:105]
    for key in failing:
        (root / "fail" / digest(key)).touch()
    payload = write_payload(tmp_path, "partition.py", PAYLOAD)
    asset = partitioned_asset(keys, root, payload)
    instance = dg.DagsterInstance.ephemeral()
    resource = compute(env, mode)

    result = materialize_range(asset, resource, instance, keys[0], keys[-1])

    assert not result.success
    error = step_failure(result)
    assert "5 of 200 partitions failed" in error
    for key in failing:
        assert repr(key) in error and "exit code 3" in error
    assert "failing on purpose: sample-100" in error
    done = _done(root)
    assert sorted(done) == sorted(set(keys) - set(failing))  # each once: exclusive create
    assert _most_at_once(list(done.values())) <= PARALLELISM
    materialized = _materialized(instance)
    assert sorted(materialized) == sorted(done)
    ids = {m["dagster_slurm/job_id"] for m in materialized.values()}
    assert len(ids) == 195
    for key, metadata in materialized.items():
        assert metadata["key_length"] == len(key)
        assert metadata["dagster_slurm/state"] == "COMPLETED"
        assert metadata["dagster_slurm/mode"] == mode
    if mode == "slurm":
        arrays = {job_id.split("_")[0] for job_id in ids}
        assert len(arrays) == 1, arrays
        (array_id,) = arrays
        tasks = wait_until(lambda: len(_sacct_tasks(env, array_id)) >= 200 and
                           _sacct_tasks(env, array_id), 60, "sacct listing the 200 tasks")
        assert {t.split("_")[0] for t in tasks} == {array_id}

    # the failed partitions again, now allowed to succeed: an array of exactly those five
    for key in failing:
        (root / "fail" / digest(key)).unlink()
    again = materialize_range(asset, resource, instance, failing[0], failing[-1])
    assert again.success
    materialized = _materialized(instance)
    assert sorted(materialized) == sorted(keys)
    rerun_ids = {materialized[k]["dagster_slurm/job_id"] for k in failing}
    if mode == "slurm":
        arrays = {job_id.split("_")[0] for job_id in rerun_ids}
        assert len(arrays) == 1
        assert sorted(int(j.split("_")[1]) for j in rerun_ids) == list(range(5))


def test_a_failed_task_is_retried_and_a_range_of_one_key_gets_its_key(mode, env, shared,
                                                                      tmp_path):
    root = shared / "array"
    _prepare(root)
    keys = [f"r{i}" for i in range(6)]
    (root / "fail" / digest("r2")).touch()
    payload = write_payload(tmp_path, "partition.py", PAYLOAD)
    asset = partitioned_asset(keys, root, payload, retries=1, env={"ARRAY_TEST_FAIL_ONCE": "1"})
    instance = dg.DagsterInstance.ephemeral()

    result = materialize_range(asset, compute(env, mode), instance, keys[0], keys[-1])

    assert result.success, step_failure(result)
    materialized = _materialized(instance)
    assert sorted(materialized) == keys
    assert sorted(_done(root)) == keys
    if mode == "slurm":  # the retry is an array of its own, of the failed index alone
        first = materialized["r0"]["dagster_slurm/job_id"].split("_")[0]
        retried = materialized["r2"]["dagster_slurm/job_id"]
        assert retried.split("_")[0] != first and retried.endswith("_2")

    (root / "done" / digest("r4")).unlink()
    one = materialize_range(asset, compute(env, mode), instance, "r4", "r4")
    assert one.success, step_failure(one)
    assert "r4" in _done(root)


HOSTILE = ["with space", "it's \"quoted\"", "$(touch {marker})", "`touch {marker}`",
           "semi;colon && echo", "ünïcødé ✓", "back\\slash", "new\\nline?", "%a_%j"]


def test_hostile_keys_arrive_verbatim_and_nothing_is_executed(mode, env, shared, tmp_path):
    root = shared / "array"
    _prepare(root)
    marker = shared / "executed"
    keys = [key.format(marker=marker) for key in HOSTILE]
    payload = write_payload(tmp_path, "partition.py", PAYLOAD)
    asset = partitioned_asset(keys, root, payload, parallelism=4)
    instance = dg.DagsterInstance.ephemeral()

    result = materialize_range(asset, compute(env, mode), instance, keys[0], keys[-1])

    assert result.success, step_failure(result)
    assert sorted(_done(root)) == sorted(keys)
    assert sorted(_materialized(instance)) == sorted(keys)
    assert not marker.exists()


TERMINATE = """
import os, sys
sys.path.insert(0, {support!r})
import dagster as dg
from compute_support import compute
from arrays_support import partitioned_asset, materialize_range
from pathlib import Path
keys = [f"k{{i}}" for i in range(12)]
instance = dg.DagsterInstance.local_temp(tempdir={home!r})
asset = partitioned_asset(keys, Path({root!r}), {payload!r}, parallelism=2)
materialize_range(asset, compute(dict(os.environ), {mode!r}), instance, keys[0], keys[-1])
"""


def test_run_termination_mid_array_ends_every_task(mode, env, shared, tmp_path):
    root = shared / "array"
    _prepare(root)
    home = tmp_path / "dagster_home"
    home.mkdir()
    payload = write_payload(tmp_path, "partition.py", PAYLOAD)
    script = write_payload(tmp_path, "run.py", TERMINATE.format(
        support=str(Path(__file__).parent), home=str(home), root=str(root), payload=payload,
        mode=mode))
    proc = subprocess.Popen([sys.executable, script],
                            env={**os.environ, **env, "ARRAY_TEST_SLEEP": "2"},
                            start_new_session=True)
    try:
        wait_until(lambda: len(list((root / "done").iterdir())) >= 2, 120,
                   "two partitions processed")
        proc.send_signal(signal.SIGINT)  # what run termination delivers to the step
        assert proc.wait(60) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
    if mode == "slurm":
        wait_until(lambda: not _queued(env), 15, "the array's tasks out of the queue")
    else:
        wait_until(lambda: not _payloads(root), 15, "no payload process left")
    processed = len(list((root / "done").iterdir()))
    instance = dg.DagsterInstance.local_temp(tempdir=str(home))
    assert _materialized(instance) == {}
    assert processed < 12


def _queued(env: dict[str, str]) -> list[str]:
    out = subprocess.run([slurm_command(env, "squeue"), "-h", "-o", "%i|%j|%T"],
                         capture_output=True, text=True,
                         env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}).stdout
    return [line for line in out.splitlines()
            if "|dsl-" in line and ("RUNNING" in line or "PENDING" in line)]


def _payloads(root: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "partition.py"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


DYING = """
import os, sys
sys.path.insert(0, {support!r})
import dagster as dg
from compute_support import compute
from arrays_support import partitioned_asset, materialize_range
from pathlib import Path
keys = [f"d{{i}}" for i in range(12)]
instance = dg.DagsterInstance.local_temp(tempdir={home!r})
asset = partitioned_asset(keys, Path({root!r}), {payload!r}, parallelism=2)
materialize_range(asset, compute(dict(os.environ), **{settings!r}), instance, keys[0], keys[-1])
"""


def _start_dying_run(env, shared, tmp_path, settings: dict) -> tuple[subprocess.Popen, Path, Path]:
    """A 12-key run with slow tasks in a process of its own, SIGKILLed (no cleanup) once two
    tasks run: ``(process, dagster home, array dir)``."""
    root = shared / "array"
    _prepare(root)
    home = tmp_path / "dagster_home"
    home.mkdir()
    payload = write_payload(tmp_path, "partition.py", PAYLOAD)
    script = write_payload(tmp_path, "run.py", DYING.format(
        support=str(Path(__file__).parent), home=str(home), root=str(root), payload=payload,
        settings=settings))
    proc = subprocess.Popen([sys.executable, script],
                            env={**os.environ, **env, "ARRAY_TEST_SLEEP": "600"})
    try:
        wait_until(lambda: len([q for q in _queued(env) if "RUNNING" in q]) >= 2, 120,
                   "two tasks running")
    finally:
        proc.send_signal(signal.SIGKILL)  # the step process dies without a word
        proc.wait(30)
    assert _queued(env), "the array must outlive its step process"
    return proc, home, root


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["slurm"])
def test_the_orphan_sensor_cancels_the_array_of_a_dead_run(mode, env, shared, tmp_path):
    from compute_support import slurm_resource

    from dagster_slurm import reconcile_orphaned_slurm_runs

    _, home, _ = _start_dying_run(env, shared, tmp_path, {})
    instance = dg.DagsterInstance.local_temp(tempdir=str(home))
    (run,) = instance.get_runs()
    instance.report_run_failed(run, "the run worker died")
    slurm = slurm_resource(env)
    try:
        reports = reconcile_orphaned_slurm_runs(instance, slurm, heartbeat_timeout=600)
        assert [r.scope for r in reports] == ["asset"], reports
        wait_until(lambda: not _queued(env), 30, "the array's tasks out of the queue")
    finally:
        slurm.close()
    assert _materialized(instance) == {}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["slurm"])
def test_the_dead_mans_switch_of_a_task_cancels_the_whole_array(mode, env, shared, tmp_path):
    _start_dying_run(env, shared, tmp_path,
                     {"heartbeat_timeout": 5.0, "allow_short_heartbeat_timeout": True})
    # no sensor runs: the tasks' own watchdogs see the heartbeat stop and cancel the array,
    # the tasks still waiting with it
    wait_until(lambda: not _queued(env), 60, "the array's tasks out of the queue")
