"""The Spark job script, run with bash against stub srun, scancel and spark-class."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from spark_stubs import run_spark_script

# Every run is job 4242, whose nodes share /tmp/dsspark-4242-<node>: these tests run one
# at a time, also under pytest-xdist (which keeps a module on one worker).

SHOW_CONF = ("bash", "-c", 'cat "$SPARK_CONF_DIR/spark-defaults.conf"; echo "URL=$SPARK_MASTER_URL"')


def wait_for(predicate, what: str, timeout: float = 20.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_slurm_mode_starts_master_and_one_worker_per_node(tmp_path: Path) -> None:
    run = run_spark_script(tmp_path, {"executor_memory": "1g", "executor_cores": 1,
                                      "num_executors": 2,
                                      "spark_conf": {"spark.sql.shuffle.partitions": "4"}},
                           SHOW_CONF)
    assert run.returncode == 0, run.stderr
    assert run.status() == "0"
    master = run.record("master", "node1")
    assert master["argv"][:3] == ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    assert "-Ddagster_slurm.job=4242" in master["daemon_opts"]
    port = master["argv"][master["argv"].index("--port") + 1]
    for node, index in (("node1", "1"), ("node2", "2")):
        worker = run.record("worker", node)["argv"]
        assert worker[-1] == f"spark://127.0.0.1:{port}"
        assert worker[worker.index("--cores") + 1] == "2"  # SLURM_CPUS_ON_NODE
        assert worker[worker.index("--memory") + 1] == "1875m"  # 2500 MiB minus a quarter
        assert worker[worker.index("--work-dir") + 1] == str(run.job_dir / "spark-work" / index)
        assert run.record("worker", node)["local_dirs"] == f"/tmp/dsspark-4242-{index}"
    assert f"URL=spark://127.0.0.1:{port}" in run.stdout
    conf = dict(line.split(" ", 1) for line in run.stdout.splitlines() if line.startswith("spark."))
    assert conf["spark.master"] == f"spark://127.0.0.1:{port}"
    assert conf["spark.executor.memory"] == "1g"
    assert conf["spark.cores.max"] == "2"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert {conf["spark.driver.port"], conf["spark.ui.port"]}.isdisjoint({port})
    assert "Spark master web UI: http://127.0.0.1:" in run.stdout
    assert "ssh -L 8080:127.0.0.1:" in run.stdout
    assert "all 2 Spark worker(s) registered" in run.stderr
    steps = run.srun_calls()
    assert [call["options"].get("ntasks") for call in steps] == ["1", "2"]
    assert steps[1]["options"]["cpus-per-task"] == "2"
    # Teardown: every stub JVM got TERM from scancel and is gone.
    for role, node in (("worker", "node1"), ("worker", "node2"), ("master", "node1")):
        assert (run.log / f"{role}.{node}.stopped").exists()
    assert run.alive_stub_pids() == []


def test_the_payload_status_is_the_jobs_and_the_cluster_is_stopped(tmp_path: Path) -> None:
    run = run_spark_script(tmp_path, {}, ("bash", "-c", "exit 7"))
    assert run.returncode == 7
    assert run.status() == "7"
    assert (run.log / "master.node1.stopped").exists()
    assert run.alive_stub_pids() == []


def test_a_failing_worker_fails_the_job_with_its_output(tmp_path: Path) -> None:
    run = run_spark_script(tmp_path, {}, ("bash", "-c", "echo payload ran"),
                           env={"STUB_SPARK_FAIL": "worker"})
    assert run.returncode == 123
    assert "payload ran" not in run.stdout
    assert "the Spark cluster did not start" in run.stderr
    assert "the workers step ended" in run.stderr
    assert "stub worker cannot start" in run.stderr
    assert run.alive_stub_pids() == []


def test_workers_that_never_register_time_out(tmp_path: Path) -> None:
    run = run_spark_script(tmp_path, {"startup_timeout": 2}, ("bash", "-c", "echo payload ran"),
                           env={"STUB_SPARK_SILENT": "1"})
    assert run.returncode == 123
    assert "all 2 worker(s) registered did not happen within 2 s" in run.stderr
    assert run.alive_stub_pids() == []


def test_a_missing_spark_class_is_reported_before_anything_starts(tmp_path: Path) -> None:
    run = run_spark_script(tmp_path, {"spark_home": "/nonexistent/spark"}, SHOW_CONF)
    assert run.returncode == 123
    assert "/nonexistent/spark/bin/spark-class is missing" in run.stderr
    assert run.srun_calls() == []


def test_cancellation_during_the_payload_stops_the_cluster(tmp_path: Path) -> None:
    def cancel(process, run) -> None:  # noqa: ANN001
        wait_for(lambda: (run.job_dir / "payload.started").exists(), "the payload")
        process.send_signal(signal.SIGTERM)

    run = run_spark_script(
        tmp_path, {}, ("bash", "-c", ": > payload.started; sleep 30"), on_start=cancel
    )
    assert run.returncode == 143
    assert run.status() == "143"
    wait_for(lambda: run.alive_stub_pids() == [], "the stub JVMs to end")


def test_local_mode_starts_nothing(tmp_path: Path) -> None:
    run = run_spark_script(tmp_path, {"executor_cores": 2, "num_executors": 3}, SHOW_CONF,
                           mode="local")
    assert run.returncode == 0, run.stderr
    assert "URL=local[6]" in run.stdout
    assert "spark.master local[6]" in run.stdout
    assert run.srun_calls() == []
    assert not list(run.log.glob("*.json"))


@pytest.mark.parametrize("strategy", ["hash_jobid", "fixed"])
def test_other_port_strategies_give_distinct_blocks(tmp_path: Path, strategy: str) -> None:
    run = run_spark_script(tmp_path, {"port_strategy": strategy}, SHOW_CONF)
    assert run.returncode == 0, run.stderr
    ports = {run.record("master", "node1")["argv"][4]}
    for node in ("node1", "node2"):
        argv = run.record("worker", node)["argv"]
        ports.add(argv[argv.index("--port") + 1])
    assert len(ports) == 3
