"""Cost and efficiency figures and the queue wait in the metadata of single jobs, run-scope
steps and local mode (``JobMetrics.as_metadata``), and which queue wait is reported."""

from __future__ import annotations

import pytest

from dagster_slurm.jobs.final_accounting import observed_metrics
from dagster_slurm.jobs.metrics import (
    COST_KEYS,
    METADATA_KEYS,
    from_local,
    from_sacct,
    from_step,
    observed_wait,
    queue_wait,
)
from dagster_slurm.scheduler.observations import JobObservation
from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.states import JobState

TIMES = "2026-12-03T09:00:00|2026-12-03T09:02:00"
# composed in SACCT_FIELDS order: a 1-node job of 120 s on 4 CPUs, its batch step peaking at
# 1 GiB; with Planned appended (Slurm 23.02 and later) it waited 42 s
CPU_LINE = (f"51|etl|COMPLETED|0:0|00:02:00|120||00:04:00|1|c1|4|{TIMES}|"
            "cpu=4,mem=2G,node=1|cpu=4,mem=2G,node=1|||")
CPU_STEP = (f"51.batch|batch|COMPLETED|0:0|00:02:00|120|1024M|00:04:00|1|c1|4|{TIMES}||"
            "cpu=4,mem=2G,node=1|||")
# composed: a 2-node job of 120 s with 2 GPUs, read without the Planned column (older Slurm)
GPU_JOB = (f"52|train|COMPLETED|0:0|00:02:00|120||00:06:00|2|g[1-2]|8|{TIMES}|"
           "cpu=8,gres/gpu=2,node=2|cpu=8,gres/gpu=2,mem=8G,node=2|||")
GIB = 2**30


def _record(text: str, job_id: str):
    return parse_sacct(text)[job_id]


def _cpu_job(planned: bool):
    return _record(CPU_LINE + ("|00:00:42" if planned else "") + "\n" + CPU_STEP, "51")


def test_every_mode_has_the_cost_keys_in_metadata_key_order() -> None:
    assert set(COST_KEYS) <= set(METADATA_KEYS)
    step = _cpu_job(True).steps[0]
    for metrics in (from_sacct("51", _cpu_job(True), 0, "COMPLETED"),
                    from_sacct("9", None, 0, "COMPLETED", source="squeue"),
                    from_step("51", step, "batch", 0, "c1"),
                    from_local("local-1", 0, 2.0, 1.0, 1024)):
        assert tuple(metrics.as_metadata()) == METADATA_KEYS


def test_a_slurm_job_reports_cpu_hours_memory_efficiency_and_slurms_queue_wait() -> None:
    metrics = from_sacct("51", _cpu_job(True), 0, "COMPLETED",
                         requested_mem_bytes=2 * GIB, observed_wait=5.0)
    meta = metrics.as_metadata()
    assert meta["dagster_slurm/cpu_hours"] == pytest.approx(120 * 4 / 3600, abs=1e-6)
    assert meta["dagster_slurm/memory_efficiency"] == 0.5  # 1 GiB peak of 2 GiB asked for
    assert meta["dagster_slurm/queue_wait_seconds"] == 42.0  # Planned, not the observed 5 s
    assert meta["dagster_slurm/gpu_hours"] is None  # accounting shows no gres/gpu: unknown
    assert meta["dagster_slurm/cpu_efficiency"] == 0.5  # unchanged: 240 s CPU / (120 s x 4)
    assert all(isinstance(meta[key], float) for key in COST_KEYS if key != "dagster_slurm/gpu_hours")


def test_gpu_hours_come_from_the_allocated_gpus_and_the_observed_wait_stands_in() -> None:
    meta = from_sacct("52", _record(GPU_JOB, "52"), 0, "COMPLETED",
                      observed_wait=3.25).as_metadata()
    assert meta["dagster_slurm/gpu_hours"] == pytest.approx(120 * 2 / 3600, abs=1e-6)
    assert meta["dagster_slurm/cpu_hours"] == pytest.approx(120 * 8 / 3600, abs=1e-6)
    assert meta["dagster_slurm/queue_wait_seconds"] == 3.25  # no Planned: observed wait
    assert meta["dagster_slurm/memory_efficiency"] is None  # nothing requested (no mem)


def test_without_final_accounting_only_the_observed_wait_is_known() -> None:
    meta = from_sacct("9", None, 0, "COMPLETED", source="squeue",
                      requested_mem_bytes=GIB, observed_wait=7.0).as_metadata()
    assert meta["dagster_slurm/queue_wait_seconds"] == 7.0
    assert all(meta[key] is None for key in ("dagster_slurm/cpu_hours", "dagster_slurm/gpu_hours",
                                             "dagster_slurm/memory_efficiency"))


def test_local_mode_has_no_cost_figures() -> None:
    meta = from_local("local-1", 0, 2.0, 1.0, 1024).as_metadata()
    assert all(meta[key] is None for key in COST_KEYS)  # no allocation, no request, no queue
    assert meta["dagster_slurm/cpu_efficiency"] == 0.5


def test_a_step_reports_its_cpu_and_gpu_hours_but_no_queue_wait() -> None:
    text = GPU_JOB + (f"\n52.0|python|COMPLETED|0:0|00:01:40|100|3000M|00:05:00|2|g[1-2]|8|"
                      f"{TIMES}||cpu=8,gres/gpu=2,node=2|||")
    step = _record(text, "52").steps[0]
    meta = from_step("52", step, "0", 0, "g1").as_metadata()
    assert meta["dagster_slurm/cpu_hours"] == pytest.approx(100 * 8 / 3600, abs=1e-6)
    assert meta["dagster_slurm/gpu_hours"] == pytest.approx(100 * 2 / 3600, abs=1e-6)
    assert meta["dagster_slurm/queue_wait_seconds"] is None
    assert meta["dagster_slurm/memory_efficiency"] is None
    unread = from_step("52", None, "0", 0, "g1").as_metadata()
    assert all(unread[key] is None for key in COST_KEYS)


def test_the_queue_wait_prefers_slurms_planned_figure() -> None:
    assert queue_wait(42.0, 5.0) == 42.0
    assert queue_wait(0.0, 5.0) == 0.0  # a job that started at once: Slurm's 0 is kept
    assert queue_wait(None, 5.0) == 5.0
    assert queue_wait(None, None) is None
    assert observed_wait(100.0, 112.5) == 12.5
    assert observed_wait(100.0, 99.0) == 0.0  # never negative
    assert observed_wait(100.0, None) is None  # the job ended before a poll saw it running
    assert observed_wait(None, 112.5) is None


def test_observed_metrics_passes_the_request_and_the_observed_wait_on() -> None:
    record = _cpu_job(False)  # no Planned column: the observed wait
    observation = JobObservation("51", JobState.COMPLETED, exit_code=0, source="sacct",
                                 accounting=record)
    meta = observed_metrics(observation, None, requested_mem_bytes=4 * GIB,
                            observed_wait=8.0).as_metadata()
    assert meta["dagster_slurm/queue_wait_seconds"] == 8.0
    assert meta["dagster_slurm/memory_efficiency"] == 0.25
    with_planned = JobObservation("51", JobState.COMPLETED, exit_code=0, source="sacct",
                                  accounting=_cpu_job(True))
    assert observed_metrics(with_planned, None, observed_wait=8.0).as_metadata()[
        "dagster_slurm/queue_wait_seconds"] == 42.0
