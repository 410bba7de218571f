"""SparkLauncher on the dev cluster: a real standalone Spark 3.5 cluster in a 2-node job.

The cluster-side environment is packed from ``env_packages`` (dagster-pipes and the pyspark
this process has) by the library and deployed under the cluster user's deployment directory,
which every node sees, wherever this repository is checked out;
``DAGSTER_SLURM_TEST_SPARK_ENV_PATH`` names a pre-deployed environment to use instead. Either
way the environment is first probed where the payload runs, on a compute node, so that an
environment the nodes cannot use fails here, saying why.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import time

import pytest
from compute_support import (
    job_id_of,
    materialize_one,
    metadata_of,
    python_on_a_node,
    run_logs,
    slurm_resource,
    squeue_names,
    write_payload,
)

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.devcluster import NODES, DevCluster
from dagster_slurm.launchers.spark import SparkLauncher

pytest.importorskip("pyspark", reason="the spark extra is not installed")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: What the payload imports on the nodes: the same pyspark as this process (the spark extra).
SPARK_PACKAGES = ["dagster-pipes", f"pyspark=={importlib.metadata.version('pyspark')}"]

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


@pytest.fixture(scope="module")
def environment(env: dict[str, str]) -> dict[str, object]:
    path = os.environ.get("DAGSTER_SLURM_TEST_SPARK_ENV_PATH")
    chosen: dict[str, object] = (
        {"pre_deployed_env_path": path} if path else {"env_packages": SPARK_PACKAGES}
    )
    probe = python_on_a_node(slurm_resource(env), "import pyspark, dagster_pipes", **chosen)
    if not probe.ok:
        pytest.fail(f"the payload environment {chosen} does not work on a compute node:\n"
                    f"{(probe.stderr or probe.stdout)[-2000:]}", pytrace=False)
    return chosen


def spark_compute(env: dict[str, str], environment: dict[str, object], mode: str,
                  launcher: SparkLauncher) -> ComputeResource:
    slurm = slurm_resource(env, mem="2500M", cpus=2, time_limit="00:05:00")
    return ComputeResource(mode=mode, slurm=slurm, default_launcher=launcher, **environment)


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
