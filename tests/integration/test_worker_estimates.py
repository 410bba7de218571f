"""Start estimates of candidate worker allocations against the dev cluster's real Slurm.

A Ray run session (nothing submitted for it: estimates need no head) asks sbatch
--test-only about candidates: on the idle ``gpu`` partition a candidate starts now; with
both gpu nodes taken by a five-minute filler job it starts when the filler's walltime ends;
a candidate on a partition that does not exist, or asking for more GPUs than a node has,
carries the scheduler's message. All candidates of a call cost one SSH round trip and one
scheduler RPC each, and a reused answer costs no RPC.
"""

import os
import subprocess
import uuid

import pytest
from compute_support import slurm_resource, squeue_state, wait_until

from dagster_slurm import RayLauncher, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.session.scaling.estimates import SbatchTestOnlyEstimator
from dagster_slurm.session.session import RunSession

pytestmark = pytest.mark.integration

FILLER_MINUTES = 5


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@pytest.fixture(scope="module")
def session(env):
    slurm = slurm_resource(env)
    config = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1,
                                      mem="500M", time_limit="00:10:00")
    session = RunSession(slurm, str(uuid.uuid4()), config, RayLauncher(include_dashboard=False),
                         activation=lambda: None)
    try:
        yield session
    finally:
        session.close(cancel=True)
        slurm.close()


def _jobs_on(env: dict[str, str], partition: str) -> list[str]:
    return subprocess.run([slurm_command(env, "squeue"), "-h", "-p", partition, "-o", "%i"], capture_output=True,
                          text=True, check=True, env={**os.environ, **env}).stdout.split()


def _gpu(**fields: object) -> SlurmWorkerAllocationConfig:
    shape: dict[str, object] = {"partition": "gpu", "num_nodes": 1, "cpus_per_task": 1,
                                "gpus_per_node": 1, "mem": "500M"}
    return SlurmWorkerAllocationConfig(**{**shape, **fields})


def test_an_idle_partition_starts_now_a_full_one_when_its_jobs_end(env, session):
    wait_until(lambda: not _jobs_on(env, "gpu"), 60, "the gpu partition to be idle")
    (idle,) = session.estimate_worker_starts([_gpu(time_limit="00:20:00")],
                                             SbatchTestOnlyEstimator())
    assert idle.error is None and idle.start_in_seconds == 0.0 and idle.starts_within(0)
    assert idle.partition == "gpu" and idle.nodes is not None and idle.time_limit_seconds == 1200
    filler = subprocess.run(
        [slurm_command(env, "sbatch"), "--parsable", "-p", "gpu", "-N", "2", "--exclusive", "-t", str(FILLER_MINUTES),
         "--job-name=dsl-estimate-filler", "--output=/dev/null", "--chdir=/tmp",
         "--wrap", "sleep 600"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    ).stdout.strip().split(";")[0]
    try:
        wait_until(lambda: squeue_state(env, filler) == "RUNNING", 60, "the filler to run")
        (busy,) = session.estimate_worker_starts([_gpu()], SbatchTestOnlyEstimator())
        assert busy.error is None and busy.start_in_seconds is not None
        # the filler's walltime ends within FILLER_MINUTES of now, and not in the next minute
        assert 60 < busy.start_in_seconds <= FILLER_MINUTES * 60 + 5, busy
        assert not busy.starts_within(60) and busy.starts_within(FILLER_MINUTES * 60 + 5)
        assert busy.time_limit_seconds == 600, "inherited from the head allocation"
    finally:
        subprocess.run([slurm_command(env, "scancel"), filler], env={**os.environ, **env}, check=False)


def test_rejected_candidates_carry_the_schedulers_message(session):
    nosuch, too_many = session.estimate_worker_starts(
        [SlurmWorkerAllocationConfig(partition="nosuch"), _gpu(gpus_per_node=3)],
        SbatchTestOnlyEstimator())
    assert nosuch.start_in_seconds is None and "invalid partition" in (nosuch.error or "").lower()
    assert too_many.start_in_seconds is None
    assert "not available" in (too_many.error or ""), too_many.error
    assert not nosuch.starts_within(10**9) and not too_many.starts_within(10**9)


def test_all_candidates_cost_one_round_trip_and_reused_answers_no_rpc(session):
    transport = session.slurm.ssh.get_transport()
    stats = session.slurm.scheduler().stats
    candidates = [_gpu(), _gpu(time_limit="00:30:00"),
                  SlurmWorkerAllocationConfig(partition="cpu", mem="500M"),
                  SlurmWorkerAllocationConfig(partition="nosuch")]
    estimator = SbatchTestOnlyEstimator(cache_seconds=60)
    trips, rpcs = transport.stats.round_trips, stats.by_command.get("sbatch_test", 0)
    first = session.estimate_worker_starts(candidates, estimator)
    assert transport.stats.round_trips - trips == 1
    assert stats.by_command.get("sbatch_test", 0) - rpcs == len(candidates)
    assert [e.options for e in first] == [tuple(o) for o in session.worker_sbatch_options(candidates)]
    trips, rpcs = transport.stats.round_trips, stats.by_command.get("sbatch_test", 0)
    again = session.estimate_worker_starts(candidates, estimator)
    # the session has no worker allocation: only the document is read, to see whether one
    # appeared that the candidates would inherit from
    assert transport.stats.round_trips - trips == 1
    assert stats.by_command.get("sbatch_test", 0) == rpcs
    assert [e.error for e in again] == [e.error for e in first]
    assert squeue_jobs_named(session) == [], "nothing was queued"


def squeue_jobs_named(session: RunSession) -> list[str]:
    snapshot = session.io.queue([session.job_name])
    assert snapshot.certain
    return list(snapshot.queue)
