"""RayLauncher on the dev cluster: real Slurm allocations, real Ray 2.60 clusters.

The cluster-side environment is packed from ``env_packages`` (ray[default,data] and
dagster-pipes); ``DAGSTER_SLURM_TEST_RAY_ENV_PATH`` points the tests at a pre-deployed
environment instead (faster when iterating). Ray nodes are heavy (a head takes 0.7 GB,
1.7 GB with the dashboard), so the tests run one cluster at a time except where two
clusters sharing nodes is the point.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compute_support import (
    job_id_of,
    materialize_one,
    metadata_of,
    ray_compute,
    ray_processes_of,
    ray_temp_dirs_of,
    run_logs,
    squeue_names,
    step_failure,
    write_payload,
)

from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.ray_ports import RayPortConfig, hash_block_index

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLUSTER_PAYLOAD = """
import os, socket, time
import ray
from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    started = time.time()
    ray.init(address="auto", logging_level="ERROR")
    alive = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["NodeManagerAddress"])

    @ray.remote(resources={"dagster_slurm_worker": 1})
    def where():
        return socket.gethostname()

    worker_hosts = ray.get([where.remote() for _ in range(2)]) if len(alive) > 1 else []
    time.sleep(float(os.environ.get("HOLD_SECONDS", "0")))
    pipes.report_asset_materialization(metadata={
        "payload_window": [started, time.time()],
        "ray_nodes": len(alive),
        "cpus_per_node": [n["Resources"].get("CPU", 0) for n in alive],
        "gpus_per_node": [n["Resources"].get("GPU", 0) for n in alive],
        "node_addresses": [n["NodeManagerAddress"] for n in alive],
        "worker_hosts": sorted(set(worker_hosts)),
        "head_host": socket.gethostname(),
        "ray_address": os.environ["RAY_ADDRESS"],
    })
"""

GPU_PAYLOAD = """
import ray
from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR")

    @ray.remote(num_gpus=1)
    def gpu_task():
        import os
        return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    alive = [n for n in ray.nodes() if n["Alive"]]
    ids, visible = ray.get(gpu_task.remote())
    pipes.report_asset_materialization(metadata={
        "gpus_per_node": [n["Resources"].get("GPU", 0) for n in alive],
        "task_gpu_ids": [str(i) for i in ids],
        "task_visible_devices": visible or "",
    })
"""

NOT_HEAD_FAILS = (
    '[ "$(hostname)" = "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" ] '
    '|| { echo "simulated ray start failure on $(hostname)"; exit 3; }'
)


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def assert_cleaned_up(env: dict[str, str], job_id: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not squeue_names(env) and not ray_processes_of(job_id):
            break
        time.sleep(0.5)
    assert squeue_names(env) == []
    assert ray_processes_of(job_id) == []
    assert ray_temp_dirs_of(job_id) == [], "temp dirs left behind"


def test_two_node_cpu_cluster(env, tmp_path, capfd):
    payload = write_payload(tmp_path, "ray_cluster.py", CLUSTER_PAYLOAD)
    compute = ray_compute(env, RayLauncher(), mem="3000M")
    result = materialize_one(payload, compute, extra_slurm_opts={"nodes": 2}, name="ray_cpu")
    assert result.success
    metadata = metadata_of(result)
    assert metadata["ray_nodes"] == 2
    assert metadata["cpus_per_node"] == [2.0, 2.0]
    assert metadata["node_addresses"] == ["127.0.1.1", "127.0.1.2"]
    assert metadata["head_host"] == "c1" and metadata["worker_hosts"] == ["c2"]
    assert str(metadata["ray_address"]).startswith("127.0.1.1:")
    out, err = capfd.readouterr()
    assert "Ray head node web UI: http://127.0.1.1:" in out
    assert "ssh -L 8265:127.0.1.1:" in out
    logs = run_logs(result)
    assert any(line.startswith("Ray head node web UI: http://127.0.1.1:") for line in logs), logs
    assert any("ssh -L 8265:127.0.1.1:" in line for line in logs)
    assert "all 2 Ray node(s) joined" in err
    assert_cleaned_up(env, job_id_of(result))


def test_gpu_cluster_offers_the_granted_gpus(env, tmp_path):
    payload = write_payload(tmp_path, "ray_gpu.py", GPU_PAYLOAD)
    compute = ray_compute(
        env, RayLauncher(num_gpus_per_node=2, include_dashboard=False), partition="gpu"
    )
    result = materialize_one(
        payload, compute, extra_slurm_opts={"nodes": 2, "gpus_per_node": 2}, name="ray_gpu"
    )
    assert result.success
    metadata = metadata_of(result)
    assert metadata["gpus_per_node"] == [2.0, 2.0]
    assert len(metadata["task_gpu_ids"]) == 1
    assert metadata["task_visible_devices"] in ("0", "1")
    assert_cleaned_up(env, job_id_of(result))


RUN_IN_OWN_PROCESS = """
import json, os, sys
sys.path.insert(0, {tests!r})
from compute_support import job_id_of, materialize_one, metadata_of, ray_compute
from dagster_slurm.launchers.ray import RayLauncher

compute = ray_compute(dict(os.environ), RayLauncher(include_dashboard=False), cpus=1)
result = materialize_one(
    {payload!r}, compute, extra_slurm_opts={{"nodes": 2}}, name={name!r},
    extra_env={{"HOLD_SECONDS": "8"}},
)
print("RESULT " + json.dumps({{
    "success": result.success, "job_id": job_id_of(result),
    "metadata": metadata_of(result) if result.success else None,
}}))
"""


def test_two_clusters_sharing_nodes_both_succeed(env, tmp_path):
    # Each cluster's asset runs in a Dagster run of its own, in a process of its own, as two
    # runs of a deployment would; both jobs get one CPU on each of the same two nodes.
    payload = write_payload(tmp_path, "ray_cluster.py", CLUSTER_PAYLOAD)
    tests = str(Path(__file__).parent)
    procs = {}
    for name in ("ray_a", "ray_b"):
        script = tmp_path / f"{name}.py"
        script.write_text(RUN_IN_OWN_PROCESS.format(tests=tests, payload=payload, name=name))
        with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen(
                [sys.executable, str(script)], stdout=out, stderr=err, env={**os.environ, **env}
            )
    results = {}
    try:
        for name, proc in procs.items():
            proc.wait(timeout=600)
            out = (tmp_path / f"{name}.out").read_text()
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            err = (tmp_path / f"{name}.err").read_text()
            assert proc.returncode == 0 and lines, f"{name} failed:\n{err[-3000:]}"
            results[name] = json.loads(lines[-1][len("RESULT ") :])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    addresses = set()
    for result in results.values():
        assert result["success"]
        metadata = result["metadata"]
        assert metadata["ray_nodes"] == 2
        assert metadata["cpus_per_node"] == [1.0, 1.0]
        addresses.add(metadata["ray_address"])
    assert len(addresses) == 2, "the two clusters must use different ports"
    (start_a, end_a), (start_b, end_b) = (r["metadata"]["payload_window"] for r in results.values())
    assert start_a < end_b and start_b < end_a, "the two clusters did not run at the same time"
    for result in results.values():
        assert_cleaned_up(env, result["job_id"])


def test_worker_that_cannot_start_fails_the_asset_fast(env, tmp_path):
    payload = write_payload(tmp_path, "ray_cluster.py", CLUSTER_PAYLOAD)
    launcher = RayLauncher(include_dashboard=False, pre_start_commands=[NOT_HEAD_FAILS])
    compute = ray_compute(env, launcher)
    started = time.monotonic()
    result = materialize_one(
        payload, compute, extra_slurm_opts={"nodes": 2}, raise_on_error=False, name="ray_broken"
    )
    elapsed = time.monotonic() - started
    assert not result.success
    failure = step_failure(result)
    assert "the Ray cluster did not start" in failure
    assert "node 1 (c2): exited with status 3 before joining" in failure
    assert "simulated ray start failure on c2" in failure
    assert elapsed < 90, f"took {elapsed:.0f} s to fail"
    assert_cleaned_up(env, job_id_of(result))


def test_worker_that_never_joins_fails_at_the_startup_timeout(env, tmp_path):
    # On the worker, a shell function named ray stands in for a 'ray start' that hangs.
    hang = (
        '[ "$(hostname)" = "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" ] '
        '|| ray() { echo "hanging instead of starting"; exec sleep 300; }'
    )
    launcher = RayLauncher(include_dashboard=False, startup_timeout=15, pre_start_commands=[hang])
    payload = write_payload(tmp_path, "ray_cluster.py", CLUSTER_PAYLOAD)
    started = time.monotonic()
    result = materialize_one(
        payload,
        ray_compute(env, launcher),
        extra_slurm_opts={"nodes": 2},
        raise_on_error=False,
        name="ray_stuck",
    )
    elapsed = time.monotonic() - started
    assert not result.success
    failure = step_failure(result)
    assert "node 1 (c2): did not join within 15 s" in failure
    assert "hanging instead of starting" in failure
    assert "node 0" not in failure.split("did not start:")[1]
    assert elapsed < 60, f"took {elapsed:.0f} s to fail"
    assert_cleaned_up(env, job_id_of(result))


@pytest.mark.parametrize("strategy", ["hash_jobid", "fixed"])
def test_other_port_strategies(env, tmp_path, strategy):
    payload = write_payload(tmp_path, "ray_cluster.py", CLUSTER_PAYLOAD)
    # A range of its own, below Linux's ephemeral ports (32768+): hash_jobid does not check
    # that its block is free, and outgoing connections take local ports from that range.
    config = RayPortConfig(range_start=30000, range_end=32499, block_size=500)
    launcher = RayLauncher(
        port_strategy=strategy,
        port_config=config,
        include_dashboard=False,
        ray_port=32379 if strategy == "fixed" else None,
    )
    result = materialize_one(
        payload, ray_compute(env, launcher), extra_slurm_opts={"nodes": 2}, name=f"ray_{strategy}"
    )
    assert result.success
    metadata = metadata_of(result)
    assert metadata["ray_nodes"] == 2
    job_id = job_id_of(result)
    if strategy == "fixed":
        expected = 32379
    else:
        expected = config.block_base(hash_block_index(job_id, 0, config.block_count))
    assert metadata["ray_address"] == f"127.0.1.1:{expected}"
    assert_cleaned_up(env, job_id)
