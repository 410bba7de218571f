"""Removing worker allocations on the dev cluster, inside a real Dagster run (real Ray).

The run's session has a Ray head on ``cpu``. A worker allocation on ``gpu`` joins it; a
payload holds a task on the worker node while ``remove_worker_allocation(drain_timeout=60)``
drains it: the task goes on there while the node drains and finishes, the node leaves, the
job ends COMPLETED (the returned state, and sacct's), it is no longer listed among the live
worker allocations and the payload goes on with tasks on the remaining node. After the
run's teardown the session document records every worker allocation as released. A worker allocation that cannot start (its nodelist is the head's busy node)
is cancelled instead, pending, and ends CANCELLED.
"""

import json
import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import wait_until
from session_support import session_compute

from dagster_slurm import ComputeResource
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.slurm.states import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PAYLOAD = """
import os, time
from pathlib import Path
import ray
from dagster_pipes import open_dagster_pipes

def wait_for(check, limit, what):
    deadline = time.time() + limit
    while not check():
        if time.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)

with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR")
    workers = [n["NodeID"] for n in ray.nodes()
               if n["Alive"] and n["Resources"].get("dagster_slurm_worker")]
    assert len(workers) == 1, workers

    @ray.remote(num_cpus=1, resources={"dagster_slurm_worker": 1}, max_retries=0)
    def hold(mark, state):
        Path(mark).write_text(ray.get_runtime_context().get_node_id())
        wait_for(lambda: Path(state).read_text().startswith("draining"), 60, "the drain")
        time.sleep(3)  # goes on while its node drains
        return ray.get_runtime_context().get_node_id()

    held_node = ray.get(hold.remote(os.environ["TASK_MARK"], os.environ["WORKER_STATE"]))
    wait_for(lambda: not any(n["Alive"] and n["NodeID"] == held_node for n in ray.nodes()),
             120, "the drained node to leave the Ray cluster")

    @ray.remote(num_cpus=1)
    def square(x):
        return x * x, ray.get_runtime_context().get_node_id()

    after = ray.get([square.remote(i) for i in range(4)])
    pipes.report_asset_materialization(metadata={
        "worker_node": workers[0], "held_node": held_node,
        "total": sum(v for v, _ in after), "after_nodes": sorted({n for _, n in after}),
    })
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _sacct_state(env: dict[str, str], job_id: str) -> str:
    """The job's final state in accounting ('' while accounting has not caught up)."""
    out = subprocess.run([slurm_command(env, "sacct"), "-n", "-X", "-P", "-o", "State", "-j", job_id],
                         capture_output=True, text=True,
                         env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}).stdout
    state = out.split()[0] if out.split() else ""
    return "" if state in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED") else state


def test_a_drained_worker_completes_its_task_and_leaves_a_pending_one_is_cancelled(
        env, tmp_path: Path) -> None:
    payload = tmp_path / "payload.py"
    payload.write_text(PAYLOAD)
    seen: dict = {}

    @dg.asset
    def grown_and_shrunk(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        head = session.allocation
        # a worker that cannot start: it asks for the head's node, whose CPUs the head holds
        blocked = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="cpu", nodelist=head.nodes[0], num_nodes=1, cpus_per_task=2,
            mem="1500M", time_limit="00:05:00"), logger=context.log)
        wait_until(lambda: blocked.state() is JobState.PENDING, 30, "the blocked worker pending")
        seen["blocked"] = session.remove_worker_allocation(blocked, logger=context.log)
        seen["blocked_id"] = blocked.job_id
        seen["document"] = session.paths.document

        worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=1, mem="1500M",
            time_limit="00:10:00"), logger=context.log)
        seen["joined"] = session.wait_for_worker_allocation(worker, timeout=120,
                                                            logger=context.log)
        seen["worker"] = worker.job_id
        # a place every node sees (the payload's task writes there as the job's user)
        mark = f"{session.slurm.base_path()}/test-marks/removal-{uuid.uuid4().hex[:8]}/running"
        session.io.write_files({f"{mark}.keep": ("", 0o600)})
        seen["mark_dir"] = os.path.dirname(mark)

        def remove() -> None:
            try:
                wait_until(lambda: os.path.exists(mark), 120, "the task on the worker node")
                seen["removed"] = session.remove_worker_allocation(worker, drain_timeout=60,
                                                                   logger=context.log)
                seen["live_after"] = [a.job_id for a in session.worker_allocations]
            except Exception as exc:  # noqa: BLE001 - reported by the assertions below
                seen["error"] = exc

        remover = threading.Thread(target=remove, daemon=True)
        remover.start()
        yield from compute.run(context=context, payload_path=str(payload), extra_env={
            "TASK_MARK": mark, "WORKER_STATE": session.paths.worker_state(worker.job_id),
        }).get_results()
        remover.join(timeout=120)
        assert not remover.is_alive(), "remove_worker_allocation did not return"

    compute = session_compute("ray", env, mem="1500M")
    (tmp_path / "home").mkdir()
    try:
        with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
            result = dg.materialize([grown_and_shrunk], resources={"compute": compute},
                                    instance=instance)
            assert result.success
            (event,) = result.get_asset_materialization_events()
            meta = {k: v.value for k, v in event.materialization.metadata.items()}
    finally:
        if "mark_dir" in seen:
            shutil.rmtree(seen["mark_dir"], ignore_errors=True)

    _check(env, seen, meta)


def _check(env: dict[str, str], seen: dict, meta: dict) -> None:
    assert "error" not in seen, seen
    assert seen["blocked"] is JobState.CANCELLED
    assert wait_until(lambda: _sacct_state(env, seen["blocked_id"]), 30,
                      "the blocked worker's accounting").startswith("CANCELLED")
    assert len(seen["joined"]) == 1
    # the drained worker: its task ran on there while the node drained, then it left
    assert seen["removed"] is JobState.COMPLETED
    assert meta["held_node"] == meta["worker_node"] == seen["joined"][0]
    assert wait_until(lambda: _sacct_state(env, seen["worker"]), 30,
                      "the worker's accounting") == "COMPLETED"
    assert seen["worker"] not in seen["live_after"]
    # the payload went on without it, on the remaining node
    assert meta["total"] == 14 and meta["after_nodes"]
    assert meta["worker_node"] not in meta["after_nodes"]
    # after the run's teardown: the session is closed, no worker allocation is left live
    with open(seen["document"]) as handle:
        doc = json.load(handle)
    assert doc["closed_at"] is not None
    assert doc["workers"][seen["worker"]]["final_state"] == "COMPLETED"
    assert doc["workers"][seen["blocked_id"]]["final_state"] == "CANCELLED"
    assert all(record["released"] for record in doc["workers"].values())
