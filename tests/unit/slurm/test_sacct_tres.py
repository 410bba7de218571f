"""Node-hours and GPU figures from sacct's NNodes and TRES columns.

The samples are composed in the column order of SACCT_FIELDS, TRES values written the way
sacct prints them (``name=value`` pairs; usage sizes with a unit; maximum nodes by name).
"""

from __future__ import annotations

import pytest

from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.commands import SACCT_BASE_FIELDS, SACCT_FIELDS
from dagster_slurm.slurm.het_records import fold_accounting_records
from dagster_slurm.slurm.tres import gpu_count, line_gpu_figures, parse_tres

TIMES = "2026-12-03T09:00:00|2026-12-03T09:01:30"
ALLOC = "billing=16,cpu=16,gres/gpu=4,mem=64G,node=2"
REQ = "billing=16,cpu=16,gres/gpu=4,mem=64G,node=2"
BATCH_AVE = "cpu=00:00:50,energy=0,fs/disk=5000,gres/gpumem=2048M,gres/gpuutil=60,mem=900M"
BATCH_MAX = "cpu=00:00:50,energy=0,fs/disk=5000,gres/gpumem=3G,gres/gpuutil=80,mem=1200M"
BATCH_NODE = "cpu=g1,energy=g1,fs/disk=g1,gres/gpumem=g1,gres/gpuutil=g1,mem=g1"
STEP_AVE = "cpu=00:01:00,gres/gpumem=10G,gres/gpuutil=90,mem=4G"
STEP_MAX = "cpu=00:01:00,gres/gpumem=12G,gres/gpuutil=99,mem=5G"
STEP_NODE = "cpu=g2,gres/gpumem=g2,gres/gpuutil=g2,mem=g2"

#: A two-node GPU job: the batch step ran 60 s on g1, step 0 ran 30 s on both nodes.
GPU_JOB = "\n".join([
    f"21|train|COMPLETED|0:0|00:01:30|90||00:03:00|2|g[1-2]|16|{TIMES}|{REQ}|{ALLOC}|||",
    f"21.batch|batch|COMPLETED|0:0|00:01:00|60|1200M|00:00:50|1|g1|8|{TIMES}||"
    f"cpu=8,gres/gpu=2,mem=32G,node=1|{BATCH_AVE}|{BATCH_MAX}|{BATCH_NODE}",
    f"21.0|python|COMPLETED|0:0|00:00:30|30|5G|00:02:10|2|g[1-2]|16|{TIMES}||"
    f"cpu=16,gres/gpu=4,mem=64G,node=2|{STEP_AVE}|{STEP_MAX}|{STEP_NODE}",
])

#: A CPU job on a site whose accounting tracks no GPU: no gres entries at all.
CPU_JOB = "\n".join([
    f"22|etl|COMPLETED|0:0|00:10:00|600||00:15:00|3|c[1-3]|6|{TIMES}|"
    "billing=6,cpu=6,mem=12G,node=3|billing=6,cpu=6,mem=12G,node=3|||",
    f"22.batch|batch|COMPLETED|0:0|00:10:00|600|800M|00:15:00|1|c1|2|{TIMES}||"
    "cpu=2,mem=4G,node=1|cpu=00:15:00,mem=700M|cpu=00:15:00,mem=800M|cpu=c1,mem=c1",
])


def test_the_requested_columns_end_with_the_tres_ones() -> None:
    assert SACCT_FIELDS[: len(SACCT_BASE_FIELDS)] == SACCT_BASE_FIELDS
    assert SACCT_FIELDS[len(SACCT_BASE_FIELDS):] == (
        "ReqTRES", "AllocTRES", "TRESUsageInAve", "TRESUsageInMax", "TRESUsageInMaxNode")


def test_node_hours_are_elapsed_times_allocated_nodes() -> None:
    job = parse_sacct(GPU_JOB)["21"]
    assert job.num_nodes == 2 and job.node_hours == pytest.approx(90 * 2 / 3600)
    assert [step.node_hours for step in job.steps] == pytest.approx([60 / 3600, 30 * 2 / 3600])
    assert parse_sacct(CPU_JOB)["22"].node_hours == pytest.approx(600 * 3 / 3600)


def test_gpu_figures_of_a_job_come_from_its_lines() -> None:
    gpu = parse_sacct(GPU_JOB)["21"].gpu
    assert (gpu.allocated, gpu.requested) == (4, 4)
    assert gpu.utilization_max_pct == 99 and gpu.utilization_max_node == "g2"
    # elapsed-weighted over the step lines: (60 % × 60 s + 90 % × 30 s) / 90 s
    assert gpu.utilization_avg_pct == pytest.approx(70.0)
    assert gpu.memory_max_bytes == 12 * 2**30
    assert gpu.usage_recorded


def test_gpu_figures_of_a_step_are_its_own_line() -> None:
    step = parse_sacct(GPU_JOB)["21"].steps[1]
    assert step.num_nodes == 2 and step.gpu.allocated == 4
    assert (step.gpu.utilization_avg_pct, step.gpu.utilization_max_pct) == (90, 99)
    assert step.gpu.memory_max_bytes == 12 * 2**30 and step.gpu.utilization_max_node == "g2"


def test_nothing_recorded_means_unknown_not_zero() -> None:
    gpu = parse_sacct(CPU_JOB)["22"].gpu
    assert gpu.allocated is None and gpu.requested is None
    assert gpu.utilization_avg_pct is None and gpu.utilization_max_pct is None
    assert gpu.memory_max_bytes is None and gpu.utilization_max_node is None
    assert not gpu.usage_recorded


def test_lines_without_the_tres_columns_still_parse() -> None:
    """Lines in the earlier column set (the base columns only) give every other figure."""
    base_only = "\n".join(line.rsplit("|", 5)[0] for line in GPU_JOB.splitlines())
    job = parse_sacct(base_only)["21"]
    assert job.elapsed_seconds == 90 and job.node_hours == pytest.approx(0.05)
    assert job.max_rss_bytes == 5 * 2**30 and len(job.steps) == 2
    assert job.gpu.allocated is None and job.gpu.utilization_max_pct is None


def test_tres_text_and_gpu_counts() -> None:
    assert parse_tres("cpu=4, gres/gpu=2 ,mem=8G,broken") == {
        "cpu": "4", "gres/gpu": "2", "mem": "8G"}
    assert parse_tres("") == {} and parse_tres(None) == {}
    assert gpu_count(parse_tres("gres/gpu:a100=2,gres/gpu:v100=1,gres/gpumem=5M")) == 3
    assert gpu_count(parse_tres("gres/gpu=2,gres/gpu:a100=2")) == 2
    assert gpu_count(parse_tres("cpu=4,gres/gpumem=1G,gres/gpuutil=3")) is None


def test_unreadable_usage_values_are_unknown() -> None:
    figures = line_gpu_figures({"tresusageinmax": "gres/gpuutil=n/a,gres/gpumem=lots",
                                "tresusageinmaxnode": "gres/gpuutil=g1",
                                "tresusageinave": "gres/gpuutil=-3"})
    assert figures.utilization_max_pct is None and figures.utilization_max_node is None
    assert figures.memory_max_bytes is None and figures.utilization_avg_pct is None
    # a bare size is bytes, as sacct prints other sizes
    assert line_gpu_figures({"tresusageinmax": "gres/gpumem=4096"}).memory_max_bytes == 4096


def test_a_heterogeneous_job_counts_every_component() -> None:
    text = "\n".join([
        f"30+0|het|COMPLETED|0:0|00:01:00|60||00:00:10|1|c1|2|{TIMES}|"
        "cpu=2,node=1|cpu=2,mem=4G,node=1|||",
        f"30+0.batch|batch|COMPLETED|0:0|00:01:00|60|100M|00:00:10|1|c1|2|{TIMES}||"
        "cpu=2,node=1|cpu=00:00:10,mem=90M|cpu=00:00:10,mem=100M|cpu=c1,mem=c1",
        f"30+1|het|COMPLETED|0:0|00:01:00|60||00:00:05|2|g[1-2]|8|{TIMES}|"
        "cpu=8,gres/gpu=4,node=2|cpu=8,gres/gpu=4,mem=32G,node=2|||",
        f"30+1.0|python|COMPLETED|0:0|00:00:40|40|2G|00:00:05|2|g[1-2]|8|{TIMES}||"
        "cpu=8,gres/gpu=4,node=2|gres/gpuutil=50|gres/gpuutil=75,gres/gpumem=6G|"
        "gres/gpuutil=g2",
    ])
    job = fold_accounting_records(parse_sacct(text))["30"]
    assert job.num_nodes == 3 and job.node_hours == pytest.approx(60 * 3 / 3600)
    assert job.gpu.allocated == 4 and job.gpu.requested == 4
    assert job.gpu.utilization_max_pct == 75 and job.gpu.utilization_max_node == "g2"
    assert job.gpu.memory_max_bytes == 6 * 2**30
