"""A worker allocation hosts the run's head after the head allocation was cancelled (dev
cluster: real Slurm jobs, real Ray).

A Ray run session's head runs on ``cpu``, one worker allocation on ``gpu`` joined it. The
head's job is scancelled mid-run; ``replace_head`` elects the worker allocation (the same
Slurm job), which starts a head-only control plane and the step server on its first node;
its own node follows the new head, so a Ray task that needs the worker's resource runs
there, in a step of the new head's step server. Removing that allocation then hands the head
over to the second worker allocation before it drains.
"""

import json
import logging
import os
import subprocess
import time

import pytest
from compute_support import squeue_state, wait_until
from worker_support import ray_nodes, ray_run_session, read_text

from dagster_slurm import SlurmWorkerAllocationConfig
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state.election_transitions import WORKER_HEAD_KIND

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOG = logging.getLogger("test_worker_head_election")

#: Run in a step: a Ray task that needs the worker allocation's resource; where it ran.
TASK = """
import json, socket, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

@ray.remote(resources={"accelerator:fake": 1}, num_cpus=0, max_retries=0)
def where():
    return ray.get_runtime_context().get_node_id()

print(json.dumps({"node": ray.get(where.remote(), timeout=60), "driver": socket.gethostname(),
                  "head_cpus": [n["Resources"].get("CPU", 0) for n in ray.nodes()
                                if n["Alive"] and "dagster_slurm_head" in n["Resources"]]}))
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@pytest.fixture
def session(env):
    session, slurm = ray_run_session(env, LOG)
    try:
        yield session
    finally:
        session.close(cancel=True)
        slurm.close()


def test_a_scancelled_head_is_replaced_by_the_worker_allocation(env, session):
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=1, mem="1500M",
        time_limit="00:10:00", ray_resources={"accelerator:fake": 1}))
    # a second worker allocation with less time left: the next head after the first one
    spare = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu", num_nodes=1, cpus_per_task=1, gpus_per_node=0, mem="1000M",
        time_limit="00:08:00"))
    session.wait_for_worker_allocation(worker, timeout=240)
    session.wait_for_worker_allocation(spare, timeout=240)
    head = session._allocation.job_id
    assert head != worker.job_id

    started = time.monotonic()
    subprocess.run(["scancel", head], check=True, env={**os.environ, **env})
    elected = session.replace_head(timeout=180)
    seconds = time.monotonic() - started
    LOG.warning("scancel of the head to replace_head returning: %.1f s", seconds)
    print(f"FAILOVER scancel -> replace_head returned: {seconds:.1f} s")

    assert elected.job_id == worker.job_id  # the same Slurm job hosts the head now
    assert squeue_state(env, worker.job_id) == "RUNNING"
    doc = session.io.read().doc
    assert doc.allocation.job_id == worker.job_id and doc.allocation.kind == WORKER_HEAD_KIND
    assert doc.election.claimed_by is None
    host = read_text(session.paths.nodes(worker.job_id)).split()[0]
    assert f"job_id={worker.job_id}" in read_text(session.paths.ray_head)

    # the worker's node joined the new head; a Ray task runs there, from a step of the new
    # head's step server (on the worker allocation's first node)
    ((node_host, (node_id, joined)),) = wait_until(
        lambda: {h: v for h, v in ray_nodes(session, worker.job_id).items()
                 if v[1] == worker.job_id}, 90, "the worker's node to join the new head"
    ).items()
    assert node_host == host and joined == worker.job_id
    result = session.execute_in_session(["python", "-c", TASK], name="after-election")
    assert result.exit_code == 0, result
    lines = [line for line in result.stdout_tail.splitlines() if line.startswith("{")]
    seen = json.loads(lines[-1])
    assert seen["driver"] == host and seen["head_cpus"] == [0]
    assert seen["node"] == ray_nodes(session, worker.job_id)[host][0]

    # removing the allocation that hosts the head hands the head over first: the spare
    # allocation hosts it (same Slurm job), the removed one drains and ends COMPLETED
    state = session.remove_worker_allocation(worker, drain_timeout=60)
    assert state is JobState.COMPLETED
    doc = session.io.read().doc
    assert doc.allocation.job_id == spare.job_id and doc.allocation.kind == WORKER_HEAD_KIND
    assert doc.workers[worker.job_id].released
    assert read_text(session.paths.drained(worker.job_id)).strip()  # its step server drained
    assert squeue_state(env, spare.job_id) == "RUNNING"
    assert f"job_id={spare.job_id}" in read_text(session.paths.ray_head)
    spare_host = read_text(session.paths.nodes(spare.job_id)).split()[0]
    result = session.execute_in_session(["hostname"], name="after-handover")
    assert result.exit_code == 0 and spare_host in result.stdout_tail, result
