"""SparkLauncher: what is accepted, the errors for what is not, and the rendered script."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dagster_slurm import SparkLauncher as TopLevel
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.logs import is_notable
from dagster_slurm.launchers import SparkLauncher
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.launchers.spark import conf_line, worker_memory_mb


def plan(mode: str = "slurm") -> ExecutionPlan:
    return ExecutionPlan(payload=("python", "/jobs/x/payload.py"), job_dir="/jobs/x",
                         status_file="/jobs/x/exit_status", drain_file="/jobs/x/drain_signal",
                         mode=mode)


def test_defaults_and_exports() -> None:
    launcher = SparkLauncher()
    assert TopLevel is SparkLauncher and isinstance(launcher, ComputeLauncher)
    assert launcher.spark_home is None
    assert (launcher.executor_memory, launcher.executor_cores, launcher.driver_memory,
            launcher.num_executors, launcher.spark_conf) == (None, None, None, None, {})
    assert launcher.local_master == "local[*]"
    assert launcher.conf_lines() == []


def test_executor_settings_become_spark_properties() -> None:
    launcher = SparkLauncher(executor_memory="2g", executor_cores=2, num_executors=3,
                             driver_memory="512m",
                             spark_conf={"spark.sql.shuffle.partitions": "8", "spark.a": "x\\y"})
    assert launcher.conf_lines() == [
        "spark.executor.memory 2g",
        "spark.executor.cores 2",
        "spark.cores.max 6",
        "spark.driver.memory 512m",
        "spark.a x\\\\y",
        "spark.sql.shuffle.partitions 8",
    ]
    assert launcher.local_master == "local[6]"
    assert SparkLauncher(executor_cores=4).local_master == "local[4]"


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"executor_memory": "2"}, "executor_memory='2': must be a JVM memory size"),
        ({"executor_memory": "0g"}, "executor_memory='0g'"),
        ({"driver_memory": "lots"}, "driver_memory='lots'"),
        ({"executor_cores": 0}, "executor_cores=0: must be a positive integer"),
        ({"num_executors": -1, "executor_cores": 1}, "num_executors=-1"),
        ({"num_executors": 2}, "num_executors=2: needs executor_cores"),
        ({"spark_home": "relative/spark"}, "spark_home='relative/spark': must be an absolute"),
        ({"spark_conf": {"sql.shuffle": "1"}}, "spark_conf['sql.shuffle']: not a Spark property"),
        ({"spark_conf": {"spark.master": "local"}}, "spark.master is set by the launcher"),
        ({"spark_conf": {"spark.executor.memory": "1g"}}, "use executor_memory"),
        ({"spark_conf": {"spark.a": "x\ny"}}, "spark_conf['spark.a']='x\\ny'"),
        ({"spark_conf": {"spark.a": " "}}, "non-blank"),
        ({"startup_timeout": 0}, "startup_timeout=0"),
        ({"port_config": {"block_size": 8}}, "port_config.block_size=8"),
    ],
)
def test_bad_values_name_the_field_and_the_value(fields: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        SparkLauncher(**fields)
    assert fragment in str(info.value)


def test_unknown_fields_are_refused() -> None:
    with pytest.raises((ValidationError, ConfigurationError)) as info:
        SparkLauncher(executor_memroy="1g")
    assert "executor_memory" in str(info.value)


def test_worker_memory_keeps_a_margin() -> None:
    assert worker_memory_mb(2500) == 1875
    assert worker_memory_mb(64000) == 64000 - 1024
    assert worker_memory_mb(1) == 1
    with pytest.raises(ValueError):
        worker_memory_mb(0)


def test_conf_lines_keep_backslashes_literal() -> None:
    assert conf_line("spark.a", "C:\\x") == "spark.a C:\\\\x"


def test_rendered_script_quotes_every_value() -> None:
    launcher = SparkLauncher(spark_home="/opt/spark it's", spark_conf={"spark.x": "$(boom) `b`"})
    script = launcher.render(plan())
    assert script.startswith("#!/bin/bash\n")
    assert "__ds_spark_home='/opt/spark it'\"'\"'s'" in script
    assert "'spark.x $(boom) `b`'" in script
    assert "@@" not in script
    assert "trap __ds_spark_on_exit EXIT" in script


def test_the_ui_lines_reach_the_dagster_log() -> None:
    assert is_notable("Spark master web UI: http://10.0.0.1:10001")
    assert is_notable("To reach the Spark UI from your machine: ssh -L 8080:10.0.0.1:10001 x")
