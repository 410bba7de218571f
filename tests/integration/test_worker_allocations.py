"""Worker allocations on the dev cluster: real Slurm jobs joining a run's real Ray 2.60 head.

One run session (a RayLauncher head on ``cpu``) is shared by the tests of this module, in
order: a worker allocation on ``gpu`` added before the head started joins once it did and
offers its resources to the head's payloads; its raylet killed with SIGKILL starts again and
rejoins; a drain through the drain file and USR1 lets running work finish and ends the job
COMPLETED; a worker allocation whose head is cancelled releases itself after its
rejoin_timeout.
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
from dagster_slurm.devcluster.info import slurm_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOG = logging.getLogger("test_worker_allocations")

#: Run on the head: the Ray nodes the head sees, and where an actor that needs the worker
#: allocation's custom resource runs.
CLUSTER_VIEW = """
import json, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

@ray.remote(resources={"accelerator:fake": 1}, num_cpus=0)
class Probe:
    def node(self):
        return ray.get_runtime_context().get_node_id()

nodes = [{"id": n["NodeID"], "resources": n["Resources"]} for n in ray.nodes() if n["Alive"]]
print(json.dumps({"nodes": nodes, "actor_node": ray.get(Probe.remote().node.remote())}))
"""

#: Run on the head: a task that needs the worker's custom resource and holds it until the
#: worker allocation drains (it writes a mark once it runs, and goes on for 2 s after the
#: worker's state file says "draining"); prints the node it ran on.
BUSY_TASK = """
import json, sys, time, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

@ray.remote(resources={"accelerator:fake": 1}, num_cpus=0, max_retries=0)
def hold(mark, state):
    open(mark, "w").write("running")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if open(state).read().strip() == "draining":
                break
        except OSError:
            pass
        time.sleep(0.2)
    time.sleep(2)
    return ray.get_runtime_context().get_node_id()

print(json.dumps({"node": ray.get(hold.remote(sys.argv[1], sys.argv[2]))}))
"""


def _slurm_env(env: dict[str, str]) -> dict[str, str]:
    return {"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}


def _final_state(env: dict[str, str], job_id: str) -> str:
    """The job's final state in accounting ('' while accounting has not caught up)."""
    out = subprocess.run([slurm_command(env, "sacct"), "-n", "-X", "-P", "-j", job_id, "-o", "State"],
                         capture_output=True, text=True, env=_slurm_env(env)).stdout.split()
    state = out[0] if out else ""
    return "" if state in ("", "PENDING", "RUNNING", "COMPLETING", "REQUEUED") else state


def _last_json(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line in the payload's output: {text!r}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@pytest.fixture(scope="module")
def session(env):
    session, slurm = ray_run_session(env, LOG)
    marks = f"{slurm.base_path()}/test-marks/workers-{uuid.uuid4().hex[:8]}"  # seen by every node
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    session.marks = marks  # type: ignore[attr-defined]
    try:
        yield session
    finally:
        session.close(cancel=True)
        slurm.close()
        shutil.rmtree(marks, ignore_errors=True)


@pytest.fixture(scope="module")
def gpu_worker(session):
    """A worker allocation on ``gpu``, added before the session's head exists; its Ray node
    ids once joined."""
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=1, mem="1500M",
        time_limit="00:10:00", ray_resources={"accelerator:fake": 1}))
    ids = session.wait_for_worker_allocation(worker, timeout=240)
    return worker, ids


@pytest.mark.release_subset
def test_a_worker_allocation_joins_and_offers_its_resources(session, gpu_worker):
    worker, ids = gpu_worker
    head = session.current_allocation()
    assert len(ids) == 1 and head is not None  # the wait started the head
    head_job = head.job_id
    ((host, (node_id, joined_head)),) = ray_nodes(session, worker.job_id).items()
    assert host.startswith("g") and node_id == ids[0] and joined_head == head_job
    assert read_text(session.paths.worker_state(worker.job_id)).strip() == "joined"
    record = session.io.read().doc.workers[worker.job_id]
    assert record.ray_node_ids == {host: ids[0]} and record.config["partition"] == "gpu"

    result = session.execute_in_session(["python", "-c", CLUSTER_VIEW], name="view")
    view = _last_json(result.stdout_tail)
    (node,) = [n for n in view["nodes"] if n["id"] == ids[0]]
    assert node["resources"]["dagster_slurm_worker"] == 1
    assert node["resources"]["accelerator:fake"] == 1
    assert node["resources"]["GPU"] == 1 and node["resources"]["CPU"] == 2
    assert view["actor_node"] == ids[0]
    head_nodes = [n for n in view["nodes"] if n["id"] != ids[0]]
    assert head_nodes and all("dagster_slurm_worker" not in n["resources"] for n in head_nodes)


def test_a_killed_raylet_starts_again_and_rejoins(session, gpu_worker):
    worker, ids = gpu_worker
    pattern = f"raylet/raylet .*dsray-{worker.job_id}-0"
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    assert pids, f"no raylet of worker allocation {worker.job_id} found"
    for pid in pids:
        os.kill(int(pid), 9)

    def rejoined() -> str | None:
        joined = list(ray_nodes(session, worker.job_id).values())
        return joined[0][0] if joined and joined[0][0] != ids[0] else None

    new_id = wait_until(rejoined, 90, "the worker node to rejoin with a new Ray node id")
    assert new_id != ids[0]
    log = read_text(session.paths.output_of(worker.job_id))
    assert "ended while head" in log and "starting it again in" in log
    assert session.wait_for_worker_allocation(worker, timeout=30) == [new_id]
    assert session.io.read().doc.workers[worker.job_id].ray_node_ids == {
        next(iter(ray_nodes(session, worker.job_id))): new_id}


def test_a_drain_lets_running_work_finish_and_ends_the_job_completed(env, session, gpu_worker):
    worker, _ids = gpu_worker
    ((_, (node_id, _)),) = ray_nodes(session, worker.job_id).items()
    mark = os.path.join(session.marks, "busy")
    outcome: dict = {}

    def busy() -> None:
        try:
            outcome["result"] = session.execute_in_session(
                ["python", "-c", BUSY_TASK, mark, session.paths.worker_state(worker.job_id)],
                name="busy")
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=busy)
    thread.start()
    wait_until(lambda: os.path.exists(mark), 60, "the task on the worker node to start")
    session.io.write_files({session.paths.worker_drain(worker.job_id):
                            (f"deadline={int(time.time()) + 90}\n", 0o600)})
    subprocess.run([slurm_command(env, "scancel"), "--batch", "--signal=USR1", worker.job_id], check=True,
                   env=_slurm_env(env))
    wait_until(lambda: read_text(session.paths.worker_state(worker.job_id)).strip() == "draining",
               20, "the worker allocation to drain")
    thread.join(60)
    assert not thread.is_alive() and "error" not in outcome, outcome
    result = outcome["result"]
    assert result.exit_code == 0, result
    assert _last_json(result.stdout_tail)["node"] == node_id  # it finished on the drained node
    wait_until(lambda: not squeue_state(env, worker.job_id), 60, "the worker job to end")
    assert read_text(session.paths.worker_state(worker.job_id)).strip() == "released drained"
    assert wait_until(lambda: _final_state(env, worker.job_id), 30, "accounting") == "COMPLETED"
    assert not ray_nodes(session, worker.job_id)
    log = read_text(session.paths.output_of(worker.job_id))
    assert "is draining" in log and "is idle and left the Ray cluster" in log


def test_a_worker_without_a_head_releases_itself_after_rejoin_timeout(env, session, gpu_worker):
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="cpu", num_nodes=1, cpus_per_task=2, gpus_per_node=0, mem="1500M",
        time_limit="00:10:00", rejoin_timeout=10))
    assert worker.config.partition == "cpu" and not worker.config.ray_resources
    session.wait_for_worker_allocation(worker, timeout=120)
    head = session.current_allocation()
    assert head is not None
    head_job = head.job_id
    subprocess.run([slurm_command(env, "scancel"), head_job], check=True, env=_slurm_env(env))
    wait_until(lambda: read_text(session.paths.worker_state(worker.job_id)).strip()
               == "released no_head", 90, "the worker allocation to release itself")
    wait_until(lambda: not squeue_state(env, worker.job_id), 30, "the worker job to end")
    assert wait_until(lambda: _final_state(env, worker.job_id), 30, "accounting") == "COMPLETED"
    log = read_text(session.paths.output_of(worker.job_id))
    assert "is not live" in log and "rejoin_timeout 10 s" in log
