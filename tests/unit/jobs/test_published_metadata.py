"""Node-hours and GPU figures in the metadata, and the published package's metadata keys."""

from __future__ import annotations

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.metrics import METADATA_KEYS, from_local, from_sacct, from_step
from dagster_slurm.jobs.published_metadata import (
    ALL_METRICS,
    PUBLISHED_KEYS,
    SlurmMetric,
    invocation_metadata,
    metric_selection,
    published_metadata,
)
from dagster_slurm.slurm.accounting import parse_sacct

TIMES = "2026-12-03T09:00:00|2026-12-03T09:02:00"
# composed in SACCT_FIELDS order: a 2-node job of 120 s with 2 GPUs; its step 0 ran 100 s
SACCT_GPU = "\n".join([
    f"41|train|COMPLETED|0:0|00:02:00|120||00:06:00|2|g[1-2]|4|{TIMES}|"
    "cpu=4,gres/gpu=2,node=2|cpu=4,gres/gpu=2,mem=8G,node=2|||",
    f"41.0|python|COMPLETED|0:0|00:01:40|100|3000M|00:05:00|2|g[1-2]|4|{TIMES}||"
    "cpu=4,gres/gpu=2,node=2|gres/gpuutil=41.5,gres/gpumem=1536M|"
    "gres/gpuutil=97,gres/gpumem=2G|gres/gpuutil=g2,gres/gpumem=g1",
])
# composed: the same shape on a site without GPU accounting
SACCT_CPU = (f"42|etl|COMPLETED|0:0|00:02:00|120||00:01:00|1|c1|2|{TIMES}|"
             "cpu=2,node=1|cpu=2,mem=4G,node=1|||")


def test_slurm_metadata_has_node_hours_and_gpu_figures() -> None:
    meta = from_sacct("41", parse_sacct(SACCT_GPU)["41"], 0, "COMPLETED").as_metadata()
    assert set(meta) == set(METADATA_KEYS)
    assert meta["dagster_slurm/node_hours"] == pytest.approx(120 * 2 / 3600, abs=1e-6)
    assert (meta["dagster_slurm/gpus"], meta["dagster_slurm/gpus_requested"]) == (2, 2)
    assert meta["dagster_slurm/gpu_utilization_avg_pct"] == 41.5
    assert meta["dagster_slurm/gpu_utilization_max_pct"] == 97.0
    assert meta["dagster_slurm/gpu_utilization_max_node"] == "g2"
    assert meta["dagster_slurm/gpu_memory_max_mb"] == 2048.0


def test_figures_not_recorded_are_null_in_every_mode() -> None:
    cpu_only = from_sacct("42", parse_sacct(SACCT_CPU)["42"], 0, "COMPLETED").as_metadata()
    no_record = from_sacct("43", None, 0, "COMPLETED", source="squeue").as_metadata()
    local = from_local("local-1", 0, 2.0, 1.0, 1024).as_metadata()
    gpu_keys = [key for key in METADATA_KEYS if "/gpu" in key]
    for meta in (cpu_only, no_record, local):
        assert set(meta) == set(METADATA_KEYS)
        assert all(meta[key] is None for key in gpu_keys)
    assert cpu_only["dagster_slurm/node_hours"] == pytest.approx(120 / 3600, abs=1e-6)
    assert no_record["dagster_slurm/node_hours"] is None  # no accounting, no figure
    assert local["dagster_slurm/node_hours"] is None  # no allocation in local mode


def test_a_step_reports_its_own_figures() -> None:
    step = parse_sacct(SACCT_GPU)["41"].steps[0]
    metrics = from_step("41", step, "0", 0, "g1")
    meta = metrics.as_metadata()
    assert meta["dagster_slurm/job_id"] == "41.0" and metrics.step_id == "0"
    assert meta["dagster_slurm/node_hours"] == pytest.approx(100 * 2 / 3600, abs=1e-6)
    assert meta["dagster_slurm/gpus"] == 2 and meta["dagster_slurm/gpu_utilization_max_pct"] == 97
    unread = from_step("41", None, "0", 0, "g1").as_metadata()
    assert unread["dagster_slurm/node_hours"] is None and unread["dagster_slurm/gpus"] is None


def test_published_keys_carry_the_published_units() -> None:
    metrics = from_sacct("41", parse_sacct(SACCT_GPU)["41"], 0, "COMPLETED")
    meta = published_metadata(metrics, ALL_METRICS)
    assert meta["slurm_job_id"] == 41 and meta["slurm_accounting_available"] is True
    assert "slurm_step_id" not in meta
    assert meta["node_hours"] == round(240 / 3600, 4)
    assert meta["cpu_efficiency_pct"] == round(360 / (120 * 4) * 100, 2)  # 75.0
    assert meta["max_memory_mb"] == round(3000.0, 2)
    assert meta["elapsed_seconds"] == 120 and meta["slurm_state"] == "COMPLETED"
    assert meta["slurm_exit_code"] == 0
    assert (meta["slurm_allocated_gpus"], meta["slurm_requested_gpus"]) == (2, 2)
    assert meta["slurm_gpu_utilization_avg_pct"] == 41.5
    assert meta["slurm_gpu_utilization_max_pct"] == 97
    assert meta["slurm_gpu_memory_max_mb"] == 2048 and meta["slurm_gpu_utilization_max_node"] == "g2"
    assert meta["slurm_gpu_accounting_available"] is True
    assert "slurm_tres_accounting" not in meta  # selectable, never attached
    assert set(meta) <= set(PUBLISHED_KEYS)


def test_unknown_figures_are_left_out_of_the_published_keys() -> None:
    cpu_only = published_metadata(
        from_sacct("42", parse_sacct(SACCT_CPU)["42"], 0, "COMPLETED"), ALL_METRICS)
    assert cpu_only["slurm_gpu_accounting_available"] is False
    assert not any(key in cpu_only for key in (
        "slurm_allocated_gpus", "slurm_gpu_utilization_avg_pct", "slurm_gpu_memory_max_mb"))
    lagging = published_metadata(from_sacct("43", None, 0, "COMPLETED", source="squeue"),
                                 ALL_METRICS)
    assert lagging == {"slurm_job_id": 43, "slurm_accounting_available": False,
                       "slurm_state": "COMPLETED", "slurm_exit_code": 0}


def test_a_step_has_its_allocation_as_job_id_and_its_own_step_id() -> None:
    step = parse_sacct(SACCT_GPU)["41"].steps[0]
    meta = published_metadata(from_step("41", step, "0", 0, "g1"), set())
    assert meta == {"slurm_job_id": 41, "slurm_step_id": "41.0",
                    "slurm_accounting_available": True}
    array = published_metadata(from_sacct("9_3", None, 0, "COMPLETED", source="squeue"), set())
    assert array["slurm_job_id"] == "9_3"  # not a plain number: kept as text


def test_a_steps_cpu_efficiency_is_divided_by_its_cpus_under_the_published_key() -> None:
    step = parse_sacct(SACCT_GPU)["41"].steps[0]  # 300 s of CPU in 100 s on 4 CPUs
    metrics = from_step("41", step, "0", 0, "g1")
    assert metrics.as_metadata()["dagster_slurm/cpu_efficiency"] == 3.0  # CPU s per s
    assert published_metadata(metrics, ALL_METRICS)["cpu_efficiency_pct"] == 75.0


def test_local_mode_has_no_published_keys() -> None:
    local = from_local("local-1", 0, 2.0, 1.0, 1024)
    assert published_metadata(local, ALL_METRICS) == {}
    assert set(invocation_metadata(local, ALL_METRICS)) == set(METADATA_KEYS)


def test_invocation_metadata_adds_the_selection_only() -> None:
    metrics = from_sacct("41", parse_sacct(SACCT_GPU)["41"], 0, "COMPLETED")
    assert invocation_metadata(metrics) == metrics.as_metadata()
    meta = invocation_metadata(metrics, metric_selection([SlurmMetric.NODE_HOURS, "max_memory_mb"]))
    assert set(meta) - set(METADATA_KEYS) == {
        "slurm_job_id", "slurm_accounting_available", "node_hours", "max_memory_mb"}


def test_selections_are_checked() -> None:
    assert metric_selection(None) == ALL_METRICS
    assert metric_selection([]) == frozenset()
    assert metric_selection({"cpu_efficiency_pct"}) == {SlurmMetric.CPU_EFFICIENCY}
    with pytest.raises(ConfigurationError, match="unknown metric 'gpu_util'; the metrics are"):
        metric_selection(["gpu_util"])
    with pytest.raises(ConfigurationError, match="not a single value"):
        metric_selection("node_hours")
