"""Removing worker allocations on the dev cluster, inside a real Dagster run (real Ray).

The run's session has a Ray head on ``cpu``. A worker allocation on ``gpu`` joins it; a
payload holds a task on the worker node while ``remove_worker_allocation(drain_timeout=60)``
drains it: the task finishes there, the node leaves, the job ends COMPLETED (the returned
state, and sacct's), its record is released and the payload goes on with tasks on the
remaining node. A worker allocation that cannot start (its nodelist is the head's busy node)
is cancelled instead, pending, and ends CANCELLED.
"""

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from compute_support import wait_until
from session_support import session_compute

from dagster_slurm import ComputeResource
from dagster_slurm.session.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.slurm.states import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Seconds the payload's task holds the worker node once the drain was requested.
HOLD_AFTER_DRAIN = 5.0

PAYLOAD = """
import json, os, time
from pathlib import Path
import ray
from dagster_pipes import open_dagster_pipes

marks = Path(os.environ["WORKER_TEST_DIR"])

def wait_for(path, limit):
    deadline = time.time() + limit
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.2)

with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR")
    workers = [n["NodeID"] for n in ray.nodes()
               if n["Alive"] and n["Resources"].get("dagster_slurm_worker")]
    assert len(workers) == 1, workers

    @ray.remote(num_cpus=1, resources={"dagster_slurm_worker": 1}, max_retries=0)
    def hold(hold_after_drain):
        (marks / "task_running").write_text(ray.get_runtime_context().get_node_id())
        wait_for(marks / "drain_requested", 120)
        time.sleep(hold_after_drain)  # runs on while the node drains
        return ray.get_runtime_context().get_node_id(), time.time()

    held_node, held_done = ray.get(hold.remote(float(os.environ["HOLD_AFTER_DRAIN"])))
    deadline = time.time() + 120
    while any(n["Alive"] and n["NodeID"] == held_node for n in ray.nodes()):
        assert time.time() < deadline, "the drained node did not leave the Ray cluster"
        time.sleep(0.5)

    @ray.remote(num_cpus=1)
    def square(x):
        return x * x, ray.get_runtime_context().get_node_id()

    after = ray.get([square.remote(i) for i in range(4)])
    pipes.report_asset_materialization(metadata={
        "worker_node": workers[0], "held_node": held_node, "held_done": held_done,
        "total": sum(v for v, _ in after), "after_nodes": sorted({n for _, n in after}),
    })
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _sacct_state(env: dict[str, str], job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id],
                         capture_output=True, text=True,
                         env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}).stdout
    return out.strip().split()[0] if out.strip() else ""


def test_a_drained_worker_completes_its_task_and_leaves_a_pending_one_is_cancelled(
        env, tmp_path: Path) -> None:
    from dagster_slurm.session.workers import add_worker_allocation, wait_for_worker_allocation

    payload = tmp_path / "payload.py"
    payload.write_text(PAYLOAD)
    marks = tmp_path / "marks"
    marks.mkdir()
    seen: dict = {}

    @dg.asset
    def grown_and_shrunk(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        head = session.allocation
        # a worker that cannot start: it asks for the head's node, whose CPUs the head holds
        blocked = add_worker_allocation(session, SlurmWorkerAllocationConfig(
            partition="cpu", nodelist=head.nodes[0], num_nodes=1, cpus_per_task=2,
            mem="1500M", time_limit="00:05:00"), context.log)
        wait_until(lambda: blocked.state() is JobState.PENDING, 30, "the blocked worker pending")
        seen["blocked"] = session.remove_worker_allocation(blocked, logger=context.log)
        seen["blocked_id"] = blocked.job_id

        worker = add_worker_allocation(session, SlurmWorkerAllocationConfig(
            partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=1, mem="1500M",
            time_limit="00:10:00"), context.log)
        seen["joined"] = wait_for_worker_allocation(session, worker, timeout=120,
                                                    logger=context.log)
        seen["worker"] = worker.job_id

        def remove() -> None:
            wait_until(lambda: (marks / "task_running").exists(), 120, "the held task")
            seen["drain_requested_at"] = time.time()
            (marks / "drain_requested").write_text("1")
            seen["removed"] = session.remove_worker_allocation(worker, drain_timeout=60,
                                                               logger=context.log)
            seen["live_after"] = [a.job_id for a in session.worker_allocations]

        remover = threading.Thread(target=remove, daemon=True)
        remover.start()
        yield from compute.run(context=context, payload_path=str(payload), extra_env={
            "WORKER_TEST_DIR": str(marks), "HOLD_AFTER_DRAIN": str(HOLD_AFTER_DRAIN),
        }).get_results()
        remover.join(timeout=120)
        assert not remover.is_alive(), "remove_worker_allocation did not return"

    compute = session_compute("ray", env, mem="1500M")
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        result = dg.materialize([grown_and_shrunk], resources={"compute": compute},
                                instance=instance)
        assert result.success
        (event,) = result.get_asset_materialization_events()
        meta = {k: v.value for k, v in event.materialization.metadata.items()}

    assert seen["blocked"] is JobState.CANCELLED
    assert _sacct_state(env, seen["blocked_id"]).startswith("CANCELLED")
    assert len(seen["joined"]) == 1
    # the drained worker: its task ran to the end there, after the drain was requested
    assert seen["removed"] is JobState.COMPLETED
    assert meta["held_node"] == meta["worker_node"] == seen["joined"][0]
    assert meta["held_done"] > seen["drain_requested_at"]
    assert wait_until(lambda: _sacct_state(env, seen["worker"]), 30, "the worker's accounting") \
        == "COMPLETED"
    assert seen["worker"] not in seen["live_after"]
    # the payload went on without it
    assert meta["total"] == 14 and meta["worker_node"] not in meta["after_nodes"]
    assert json.loads(json.dumps(meta["after_nodes"]))  # tasks ran on the remaining node
    assert os.path.exists(marks / "drain_requested")
