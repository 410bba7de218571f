"""The parsers on the release cluster's recordings (``golden/<release>/commands.tsv``).

Those recordings (see ``golden/README.md``) hold a finished job with an srun step
(``golden-done``), a running two-node job (``golden-busy``), one pending behind it
(``golden-waiter``), a GPU job whose comment contains ``|`` (``golden-gpu``) and a cancelled
one (``golden-cancelled``), plus jobs of an earlier run still listed (same names).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.parsers import (
    min_job_age_seconds,
    parse_scontrol_config,
    parse_squeue,
)
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.test_only import parse_test_only
from dagster_slurm.slurm.version import parse_slurm_version

GOLDEN = Path(__file__).parent / "golden"
#: squeue %b of a job submitted with --gres=gpu:2: the spelling changed after 22.05.
TRES_PER_NODE = {"22.05": "gres:gpu:2", "24.11": "gres/gpu:2"}
RELEASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "commands.tsv").is_file())


class Recording:
    def __init__(self, release: str) -> None:
        self.dir = GOLDEN / release
        with (self.dir / "commands.tsv").open() as handle:
            rows = list(csv.reader(handle, delimiter="\t"))[1:]
        self.rc = {row[0]: int(row[1]) for row in rows}
        with (self.dir / "jobs.tsv").open() as handle:
            self.jobs = {row[0]: row[1] for row in list(csv.reader(handle, delimiter="\t"))[1:]}

    def out(self, name: str) -> str:
        return (self.dir / f"{name}.stdout").read_text()

    def err(self, name: str) -> str:
        return (self.dir / f"{name}.stderr").read_text()


@pytest.fixture(params=RELEASES)
def rec(request: pytest.FixtureRequest) -> Recording:
    return Recording(request.param)


def test_both_releases_are_recorded() -> None:
    assert {"22.05", "24.11"} <= set(RELEASES)


def test_version(rec: Recording) -> None:
    version = parse_slurm_version(rec.out("sinfo_version"))
    assert version is not None and version.series == rec.dir.name


@pytest.mark.parametrize("name", ["squeue_format", "squeue_format_ids", "squeue_user",
                                  "squeue_observe"])
def test_squeue_outputs(rec: Recording, name: str) -> None:
    records = {r.job_id: r for r in parse_squeue(rec.out(name))}
    jobs = rec.jobs
    assert {jobs[n] for n in jobs} <= set(records)
    busy, waiter = records[jobs["golden-busy"]], records[jobs["golden-waiter"]]
    gpu, done = records[jobs["golden-gpu"]], records[jobs["golden-done"]]
    assert busy.state is JobState.RUNNING and busy.nodes == ("c1", "c2") and busy.num_nodes == 2
    assert waiter.state is JobState.PENDING and waiter.reason == "Resources"
    assert waiter.nodes == () and waiter.start_time is not None  # the expected start
    assert gpu.comment == "tok|with|pipes" and gpu.partition == "gpu"
    assert gpu.tres_per_node == TRES_PER_NODE[rec.dir.name] and gpu.gpus_per_node == 2
    assert done.state is JobState.COMPLETED and done.min_memory_bytes == 1000 * 1024**2
    assert records[jobs["golden-cancelled"]].comment is None  # (null)
    if name == "squeue_observe":
        assert gpu.tres_alloc is not None and "gres/gpu=2" in gpu.tres_alloc


def test_sacct(rec: Recording) -> None:
    records = parse_sacct(rec.out("sacct_parsable2"))
    jobs = rec.jobs
    done, gpu = records[jobs["golden-done"]], records[jobs["golden-gpu"]]
    assert done.state is JobState.COMPLETED and [s.step_id for s in done.steps] == ["batch", "0"]
    batch_rss = next(line.split("|")[6] for line in rec.out("sacct_parsable2").splitlines()
                     if line.startswith(f"{jobs['golden-done']}.batch|"))
    assert done.max_rss_bytes == int(batch_rss.rstrip("K")) * 1024  # the largest step's
    assert gpu.gpu.allocated == 2 and gpu.state is JobState.RUNNING and gpu.end_time is None
    cancelled = records[jobs["golden-cancelled"]]
    assert cancelled.state is JobState.CANCELLED and cancelled.cancelled_by == 1001
    waiter = records[jobs["golden-waiter"]]
    assert waiter.state is JobState.PENDING and waiter.nodes == ()
    # AllocCPUS of a waiting job: the request (2 nodes x 1 CPU) on 22.05, nothing on 24.11
    assert waiter.alloc_cpus == {"22.05": 2, "24.11": 0}[rec.dir.name]


def test_test_only(rec: Recording) -> None:
    for name in ("test_only_runnable_idle", "test_only_runnable_busy", "test_only_over_maxtime"):
        answer = parse_test_only(rec.err(name), rec.rc[name])
        assert answer.runnable is True and answer.start_time is not None, name
    busy = parse_test_only(rec.err("test_only_runnable_busy"), rec.rc["test_only_runnable_busy"])
    assert busy.nodes == ("c1", "c2") and busy.processors == 2
    gpus = parse_test_only(rec.err("test_only_too_many_gpus"), rec.rc["test_only_too_many_gpus"])
    assert gpus.runnable is False and gpus.error == "Requested node configuration is not available"
    bad = parse_test_only(rec.err("test_only_bad_partition"), rec.rc["test_only_bad_partition"])
    assert bad.runnable is False and bad.error == "Invalid partition name specified"


def test_config(rec: Recording) -> None:
    config = parse_scontrol_config(rec.out("scontrol_show_config"))
    assert min_job_age_seconds(config) == 120
    assert parse_slurm_version(config["SLURM_VERSION"]) is not None
