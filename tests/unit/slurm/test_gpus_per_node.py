"""SqueueRecord.gpus_per_node reads squeue %b in the spelling of either release."""

from __future__ import annotations

import pytest

from dagster_slurm.slurm.parsers import parse_squeue


@pytest.mark.parametrize(("tres", "gpus"), [
    ("gres:gpu:2", 2),                       # 22.05.8, measured
    ("gres/gpu:2", 2),                       # 24.11.5, measured
    ("gres/gpu:a100:2", 2),
    ("gres:gpu:a100:4", 4),
    ("gres/gpu:a100:2,gres/gpu:v100:1", 3),
    ("gres/gpu:2,gres/shard:1", 2),
    ("gres/shard:3", None),
    ("N/A", None),
])
def test_gpus_per_node(tres: str, gpus: int | None) -> None:
    record = parse_squeue(f"JOBID|TRES_PER_NODE\n1|{tres}\n")[0]
    assert record.gpus_per_node == gpus
