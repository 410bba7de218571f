"""A worker allocation hosts the run's head after the head's Ray stopped (dev cluster: real
Slurm jobs, real Ray).

A Ray run session's head runs on ``cpu``, two worker allocations on ``gpu`` joined it. The
head's GCS is killed while its job runs and a driver step is connected: the head's step
server records that its Ray stopped, ``replace_head`` elects the worker allocation with the
most time left (the same Slurm job), which starts a head-only control plane and the step
server on its first node; its own node follows the new head, so a Ray task that needs the
worker's resource runs there, in a step of the new head's step server. The driver on the
lost head fails with ``SlurmAllocationEnded``, not as an ordinary step failure. Removing
the hosting allocation then hands the head over to the second worker allocation before it
drains.
"""

import json
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid

import pytest
from compute_support import squeue_state, wait_until
from worker_support import ray_nodes, ray_run_session, read_text

from dagster_slurm import SlurmWorkerAllocationConfig
from dagster_slurm.agent import write_file_op
from dagster_slurm.session.core.errors import SlurmAllocationEnded
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


#: Run in a step on the head: a driver connected to the head's Ray, submitting a task every
#: half second, until its Ray fails (it gives the GCS 30 s to come back, as configured).
HOLD = """
import pathlib, sys, time, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def ping():
    return 1

ray.get(ping.remote(), timeout=60)
pathlib.Path(sys.argv[1]).write_text("connected")
while True:
    ray.get(ping.remote(), timeout=60)
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@pytest.fixture
def session(env):
    session, slurm = ray_run_session(env, LOG)
    marks = f"{slurm.base_path()}/test-marks/election-{uuid.uuid4().hex[:8]}"  # every node sees it
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    session.marks = marks  # type: ignore[attr-defined]
    try:
        yield session
    finally:
        session.close(cancel=True)
        slurm.close()
        shutil.rmtree(marks, ignore_errors=True)


def _start_driver(session) -> tuple[threading.Thread, dict]:
    """A driver step on the head (:data:`HOLD`), running in a thread until its Ray fails;
    returns once it is connected. The dict gets its ``result`` or ``error``."""
    mark = os.path.join(session.marks, "connected")
    outcome: dict = {}

    def drive() -> None:
        try:
            outcome["result"] = session.execute_in_session(
                ["python", "-c", HOLD, mark], name="holding",
                env={"RAY_gcs_rpc_server_reconnect_timeout_s": "30"})
        except Exception as exc:  # noqa: BLE001 - asserted by the test
            outcome["error"] = exc

    driver = threading.Thread(target=drive)
    driver.start()
    wait_until(lambda: os.path.exists(mark), 90, "the driver to connect to the head's Ray")
    return driver, outcome


def _kill_gcs(head: str) -> None:
    """SIGKILL the GCS of head allocation ``head`` (its job keeps running)."""
    gcs = subprocess.run(["pgrep", "-f", f"gcs_server .*dsray-{head}-0"], capture_output=True,
                         text=True).stdout.split()
    assert gcs, f"no gcs_server of head {head} found"
    for pid in gcs:
        os.kill(int(pid), 9)


def test_a_head_whose_ray_stopped_is_replaced_by_the_worker_allocation(env, session):
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=1, mem="1500M",
        time_limit="00:10:00", ray_resources={"accelerator:fake": 1}))
    # a second worker allocation with less time left: the next head after the first one
    spare = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu", num_nodes=1, cpus_per_task=1, gpus_per_node=0, mem="1000M",
        time_limit="00:08:00"))
    session.wait_for_worker_allocation(worker, timeout=240)
    session.wait_for_worker_allocation(spare, timeout=240)
    current = session.current_allocation()
    assert current is not None
    head = current.job_id
    assert head != worker.job_id

    driver, outcome = _start_driver(session)
    # the head's Ray stops while its job runs: its step server records it, the head is replaced
    started = time.monotonic()
    _kill_gcs(head)
    wait_until(lambda: read_text(session.paths.ray_stopped(head)).strip(), 60,
               "the head's step server to record that its Ray stopped")
    elected = session.replace_head(timeout=180)
    seconds = time.monotonic() - started
    LOG.warning("GCS of the head killed to replace_head returning: %.1f s", seconds)
    print(f"FAILOVER head Ray stopped -> replace_head returned: {seconds:.1f} s")

    # the driver on the lost head fails as an allocation end (the relay loop's signal)
    driver.join(120)
    assert not driver.is_alive()
    error = outcome.get("error")
    assert isinstance(error, SlurmAllocationEnded), outcome
    assert error.result.allocation_state in ("RAY_STOPPED", "REPLACED"), error.result
    assert error.result.job_id == head

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
