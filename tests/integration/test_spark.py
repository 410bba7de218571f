"""SparkLauncher on the dev cluster: a real standalone Spark 3.5 cluster in a 2-node job.

The cluster-side environment: the nodes share this machine's filesystem (except /tmp)
and Python, so the test makes a small venv of the system's python3 under the cluster
user's deployment directory whose only content is a ``.pth`` line pointing at this test
process's own site-packages (which has pyspark, from the ``spark`` extra, and
dagster-pipes). Nothing is packed or uploaded, and the venv is made once per machine.
When that is not possible (another Python version, site-packages the cluster user cannot
read) the environment is packed from ``env_packages`` instead;
``DAGSTER_SLURM_TEST_SPARK_ENV_PATH`` names a pre-deployed environment to use as is.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sysconfig
import time
from pathlib import Path

import dagster as dg
import pytest
from compute_support import materialize_one, run_logs, slurm_resource, squeue_names, write_payload

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.devcluster import NODES, DevCluster
from dagster_slurm.launchers.spark import SparkLauncher

pytest.importorskip("pyspark", reason="the spark extra is not installed")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPARK_PACKAGES = ["dagster-pipes", "pyspark==3.5.8"]

CLUSTER_PAYLOAD = """
import os, time
from dagster_pipes import open_dagster_pipes
from pyspark.sql import SparkSession

def where(index):
    time.sleep(0.3)
    return index, os.environ.get("SLURMD_NODENAME", ""), os.getcwd()

with open_dagster_pipes() as pipes:
    spark = SparkSession.builder.appName("dagster-slurm-spark-test").getOrCreate()
    sc = spark.sparkContext
    deadline = time.monotonic() + 60
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    seen = sc.parallelize(range(16), 16).map(where).collect()
    pipes.report_asset_materialization(metadata={
        "master": sc.master,
        "env_master": os.environ["SPARK_MASTER_URL"],
        "total": sum(index for index, _, _ in seen),
        "task_nodes": sorted({node for _, node, _ in seen}),
        "task_dirs": sorted({cwd.split("/spark-work/")[-1].split("/")[0] for _, _, cwd in seen}),
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
    })
    spark.stop()
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _as_cluster_user(env: dict[str, str], *argv: str) -> bool:
    user = env.get("SLURM_EDGE_NODE_USER", "")
    command = ["runuser", "-u", user, "--", *argv] if user and os.geteuid() == 0 else list(argv)
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


def shared_venv(env: dict[str, str]) -> str | None:
    """A venv of /usr/bin/python3 that sees this process's site-packages, or None."""
    site = sysconfig.get_paths()["purelib"]
    base = env.get("SLURM_DEPLOYMENT_BASE_PATH", "")
    if not base or not Path("/usr/bin/python3").exists():
        return None
    name = hashlib.sha256(site.encode()).hexdigest()[:12]
    venv = Path(base) / "test-envs" / f"spark-{name}"
    if not (venv / "bin" / "activate").exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        (own_site,) = venv.glob("lib/python3*/site-packages")
        (own_site / "dagster_slurm_test_site.pth").write_text(site + "\n")
    probe = "import pyspark, dagster_pipes"
    return str(venv) if _as_cluster_user(env, str(venv / "bin/python"), "-c", probe) else None


@pytest.fixture(scope="module")
def environment(env: dict[str, str]) -> dict[str, object]:
    path = os.environ.get("DAGSTER_SLURM_TEST_SPARK_ENV_PATH") or shared_venv(env)
    return {"pre_deployed_env_path": path} if path else {"env_packages": SPARK_PACKAGES}


def spark_compute(env: dict[str, str], environment: dict[str, object], mode: str,
                  launcher: SparkLauncher) -> ComputeResource:
    slurm = slurm_resource(env, mem="2500M", cpus=2, time_limit="00:05:00")
    return ComputeResource(mode=mode, slurm=slurm, default_launcher=launcher, **environment)


def metadata_of(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    (event,) = result.get_asset_materialization_events()
    return {key: value.value for key, value in event.materialization.metadata.items()}


def job_id_of(result: dg.ExecuteInProcessResult) -> str:
    for message in run_logs(result):
        found = re.search(r"Submitted Slurm job (\d+)", message or "")
        if found:
            return found.group(1)
    raise AssertionError("no job id in the run's logs")


def spark_processes(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def assert_cleaned_up(env: dict[str, str], job_id: str, err: str = "") -> None:
    deadline = time.monotonic() + 15
    patterns = (f"dagster_slurm.job={job_id}", "CoarseGrainedExecutorBackend")
    while time.monotonic() < deadline:
        if not squeue_names(env) and not any(map(spark_processes, patterns)):
            break
        time.sleep(0.3)
    assert squeue_names(env) == []
    for pattern in patterns:
        assert spark_processes(pattern) == [], pattern
    info = DevCluster().info()
    for node in NODES:  # each node has its own /tmp
        left = sorted(path.name for path in info.node_tmp(node.name).glob(f"dsspark-{job_id}-*"))
        assert left == [], (node.name, [line for line in err.splitlines() if "spark" in line][-40:])


def test_two_node_cluster_runs_tasks_on_both_workers(env, environment, tmp_path, capfd):
    payload = write_payload(tmp_path, "spark_cluster.py", CLUSTER_PAYLOAD)
    launcher = SparkLauncher(spark_conf={"spark.sql.shuffle.partitions": "4"})
    compute = spark_compute(env, environment, "slurm", launcher)
    result = materialize_one(payload, compute, extra_slurm_opts={"nodes": 2}, name="spark_two")
    assert result.success
    metadata = metadata_of(result)
    assert str(metadata["master"]).startswith("spark://127.0.1.1:")
    assert metadata["env_master"] == metadata["master"]
    assert metadata["total"] == sum(range(16))
    assert metadata["task_nodes"] == ["c1", "c2"]  # both workers ran tasks
    assert metadata["task_dirs"] == ["1", "2"]  # in their own work directories
    assert metadata["shuffle_partitions"] == "4"
    out, err = capfd.readouterr()
    assert "all 2 Spark worker(s) registered" in err
    # Each worker offers what Slurm granted on its node: 2 CPUs, 2500 MiB less the margin.
    offers = re.findall(r"Registering worker (127\.0\.1\.\d):\d+ with (\d+) cores, ([\d.]+) MiB", err)
    assert sorted(offers) == [("127.0.1.1", "2", "1875.0"), ("127.0.1.2", "2", "1875.0")]
    logs = run_logs(result)
    assert any(line.startswith("Spark master web UI: http://127.0.1.1:") for line in logs), logs
    assert any("ssh -L 8080:127.0.1.1:" in line for line in logs)
    assert_cleaned_up(env, job_id_of(result), err)
