"""The Slurm release, learnt in a connection's first round trip, picks the commands:
against the dev cluster of the machine's release, and (marked release_subset) against the
second release's cluster that scripts/test.sh brings up after the main run."""

from __future__ import annotations

import time
import uuid

import pytest

from dagster_slurm import SlurmResource
from dagster_slurm.agent import exec_op
from dagster_slurm.slurm import JobState, SbatchSpec
from dagster_slurm.slurm.version import SlurmFeature, parse_slurm_version

pytestmark = [pytest.mark.integration, pytest.mark.release_subset]


@pytest.fixture
def slurm(slurm_cluster) -> SlurmResource:
    """The library's resource on the cluster under test (the second release's in the
    release_subset pass of scripts/test.sh)."""
    resource = SlurmResource.from_env(environ=slurm_cluster.env())
    yield resource
    resource.close()


def test_the_release_comes_with_the_first_request(slurm: SlurmResource) -> None:
    scheduler = slurm.scheduler()
    transport = scheduler.agent.transport
    slurm.agent().run(exec_op(["true"]))  # installs the agent if needed
    printed = slurm.agent().run(exec_op(["squeue", "--version"])).stdout
    assert scheduler.version is not None
    assert scheduler.version == parse_slurm_version(printed)
    before = transport.stats.round_trips
    slurm.agent().run(exec_op(["true"]))
    assert transport.stats.round_trips - before <= 1


def test_a_state_poll_of_a_running_job(slurm: SlurmResource) -> None:
    scheduler = slurm.scheduler()
    job_dir = f"{slurm.base_path()}/test-jobs/{uuid.uuid4().hex[:12]}"
    name = f"release-{uuid.uuid4().hex[:6]}"
    script = f"{job_dir}/job.sh"
    job = scheduler.submit(
        SbatchSpec(job_name=name, script_path=script, partition="cpu", time_limit="00:02:00",
                   cpus_per_task=1, mem="50M", output="/dev/null"),
        state_path=f"{job_dir}/state.json", files={script: ("#!/bin/sh\nsleep 60\n", 0o755)})
    try:
        deadline = time.monotonic() + 60
        while scheduler.status([name], [job.job_id]).job(job.job_id).state is not JobState.RUNNING:
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(1)
        snapshot = scheduler.status([name], [job.job_id, "999999"], state_only=True)
        record = snapshot.queue[job.job_id]
        assert record.state is JobState.RUNNING and snapshot.absent == ("999999",)
        only_states = scheduler.version is not None and \
            scheduler.version.offers(SlurmFeature.ONLY_JOB_STATE)
        # --only-job-state fills in id and state only; 22.05 lists every column
        assert (record.name is None) is only_states
        assert (record.name == name) is not only_states
    finally:
        scheduler.cancel([job.job_id])
