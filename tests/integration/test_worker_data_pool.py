"""A Ray Data actor pool grows onto a worker allocation added while it runs (dev cluster, real
Dagster run, real Ray Data 2.60).

The run has a separate head on ``cpu`` (its Ray node offers no CPUs) and its first worker
allocation on the other ``cpu`` node. The payload maps a dataset through an actor pool with
``concurrency=(1, 4)``, one CPU per actor. The pool's actors on the ``cpu`` worker hold their
first batch until an actor on the ``gpu`` node processed one, so that input stays queued and
the pool is fully used until the pool grew there: the asset adds the ``gpu`` worker
allocation (``ray_resources={"accelerator:fake": 1}``) once the pool runs. An actor asking
for ``accelerator:fake`` lands on the new node. After the first dataset is done the asset
removes the ``gpu`` allocation (COMPLETED); the payload maps a second dataset on the rest
while it drains, holding that dataset's first batch of each actor until the removal
returned. Every task and actor that asks for resources records its Ray node: none is the
head's.
"""

import os
import shutil
import threading
import uuid

import dagster as dg
import pytest
from compute_support import RAY_PACKAGES, slurm_resource, wait_until
from session_support import active_jobs

from dagster_slurm import (
    ComputeResource,
    RayLauncher,
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
)
from dagster_slurm.agent import write_file_op

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The payload; MARKS is a directory every node sees. Files there: ``actor-*`` (an actor of
#: the first pool started), ``grown`` (an actor on a node offering accelerator:fake processed
#: a batch), ``first-done`` (the first dataset is consumed), ``worker-log`` (written by the
#: test: the gpu allocation's log, which says when its node is draining in Ray), ``removed``
#: (written by the test: the removal's final state).
DATA_POOL_PAYLOAD = """
import gc, os, time, uuid
import ray
from dagster_pipes import open_dagster_pipes

MARKS = os.environ["MARKS"]


def mark(name, text=""):
    with open(os.path.join(MARKS, name), "w") as handle:
        handle.write(text)


def wait_for(name, check=lambda text: True, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(os.path.join(MARKS, name)) as handle:
                if check(handle.read()):
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def read_node(batch):
    # fused into the read tasks (one CPU each)
    batch["read_node"] = [ray.get_runtime_context().get_node_id()] * len(batch["id"])
    return batch


class Tag:
    def __init__(self, phase):
        self.phase = phase
        self.node = ray.get_runtime_context().get_node_id()
        self.fake = any(n["NodeID"] == self.node and "accelerator:fake" in n["Resources"]
                        for n in ray.nodes())
        self.held = False
        if phase == "first":
            mark(f"actor-{uuid.uuid4().hex}", self.node)

    def __call__(self, batch):
        if self.phase == "first" and self.fake:
            mark("grown", self.node)
        elif not self.held:
            # the actor's first batch waits: for the pool to grow onto the new node (first
            # dataset), for the removal of that node's allocation to return (second one)
            self.held = True
            wait_for("grown" if self.phase == "first" else "removed")
        rows = len(batch["id"])
        batch["node"] = [self.node] * rows
        batch["after_removal"] = [os.path.exists(os.path.join(MARKS, "removed"))] * rows
        return batch


def pool(ds, phase):
    out = ds.map_batches(Tag, fn_constructor_args=(phase,), concurrency=(1, 4), num_cpus=1,
                         batch_size=None, batch_format="pandas")
    rows = [{"id": int(row["id"]), "node": str(row["node"]), "read_node": str(row["read_node"]),
             "after_removal": bool(row["after_removal"])}
            for batch in out.iter_batches(batch_format="pandas")
            for row in batch.to_dict("records")]
    del out
    gc.collect()  # the pool's actors go with the last reference to them
    return rows


@ray.remote(resources={"accelerator:fake": 1}, num_cpus=0)
class Probe:
    def node(self):
        return ray.get_runtime_context().get_node_id()


with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    deadline = time.time() + 180
    while time.time() < deadline and not any(
            n["Alive"] and "dagster_slurm_worker" in n["Resources"] for n in ray.nodes()):
        time.sleep(0.5)  # the first worker allocation joins after the head started
    (head,) = [n for n in ray.nodes() if n["Alive"] and "dagster_slurm_head" in n["Resources"]]
    source = ray.data.range(96, override_num_blocks=32).map_batches(read_node).materialize()
    first = pool(source, "first")
    probe = Probe.remote()
    probe_node = ray.get(probe.node.remote(), timeout=120)
    ray.kill(probe)
    mark("first-done")
    # the second dataset starts once Ray drains the gpu node (nothing new is placed there):
    # its allocation's log says so
    wait_for("worker-log", lambda text: bool(text.strip()))
    with open(os.path.join(MARKS, "worker-log")) as handle:
        log_path = handle.read().strip()
    deadline = time.time() + 240
    while time.time() < deadline and not os.path.exists(os.path.join(MARKS, "removed")):
        try:
            with open(log_path) as handle:
                if "is draining" in handle.read():
                    break
        except OSError:
            pass
        time.sleep(0.2)
    second = pool(source, "second")
    with open(os.path.join(MARKS, "removed")) as handle:
        removed = handle.read().strip()
    pipes.report_asset_materialization(metadata={
        "head_node": head["NodeID"],
        "head_resources": sorted(f"{k}={v}" for k, v in head["Resources"].items()
                                 if v and not k.startswith("node:")
                                 and k not in ("memory", "object_store_memory")),
        "read_nodes": sorted({r["read_node"] for r in first + second}),
        "first_rows": sorted(r["id"] for r in first),
        "first_nodes": sorted({r["node"] for r in first}),
        "second_rows": sorted(r["id"] for r in second),
        "second_nodes": sorted({r["node"] for r in second}),
        "second_after_removal": all(r["after_removal"] for r in second),
        "probe_node": probe_node,
        "removed_seen": removed,
    })
"""

GPU_WORKER = SlurmWorkerAllocationConfig(
    partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=0, mem="2500M",
    time_limit="00:10:00", ray_resources={"accelerator:fake": 1})


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _compute(env: dict[str, str]) -> ComputeResource:
    kwargs: dict = {}
    if os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"):
        kwargs["pre_deployed_env_path"] = os.environ["DAGSTER_SLURM_TEST_RAY_ENV_PATH"]
    else:
        kwargs["env_packages"] = RAY_PACKAGES
    return ComputeResource(
        mode="slurm", slurm=slurm_resource(env), allocation_scope="run",
        default_launcher=RayLauncher(include_dashboard=False),
        ray_head_allocation=SlurmRunAllocationConfig(
            partition="cpu", mem="2000M", time_limit="00:10:00", heartbeat_interval=2,
            allow_short_heartbeat_timeout=True),
        run_allocation=SlurmRunAllocationConfig(
            partition="cpu", cpus_per_task=2, mem="2500M", time_limit="00:10:00"),
        **kwargs,
    )


def _grow_and_shrink(session, marks: str, seen: dict) -> None:
    """The asset's helper thread: add the gpu worker allocation once the pool runs, remove it
    once the first dataset is done; what it saw goes to ``seen``."""
    try:
        wait_until(lambda: any(name.startswith("actor-") for name in os.listdir(marks)),
                   240, "an actor of the pool to start")
        worker = session.add_worker_allocation(GPU_WORKER)
        seen["gpu_job"] = worker.job_id
        seen["gpu_ids"] = session.wait_for_worker_allocation(worker, timeout=240)
        wait_until(lambda: os.path.exists(os.path.join(marks, "first-done")), 240,
                   "the first dataset to be consumed")
        seen["live_before_removal"] = [w.job_id for w in session.worker_allocations]
        with open(os.path.join(marks, "worker-log"), "w") as handle:
            handle.write(session.paths.output_of(worker.job_id))
        state = session.remove_worker_allocation(worker, drain_timeout=60)
        seen["removed"] = state.value if state is not None else "None"
    except Exception as exc:  # noqa: BLE001 - asserted by the test
        seen["error"] = repr(exc)
    finally:
        with open(os.path.join(marks, "removed"), "w") as handle:
            handle.write(str(seen.get("removed", "failed")))


def test_a_data_pool_grows_onto_an_added_worker_allocation_and_survives_its_removal(
        env, tmp_path):
    payload = tmp_path / "data_pool.py"
    payload.write_text(DATA_POOL_PAYLOAD)
    compute = _compute(env)
    slurm = compute.slurm
    marks = f"{slurm.base_path()}/test-marks/data-pool-{uuid.uuid4().hex[:8]}"  # every node sees it
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    seen: dict = {}

    @dg.asset
    def data_pool(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        seen["head"] = session.allocation.job_id
        seen["name"] = session.job_name
        helper = threading.Thread(target=_grow_and_shrink, args=(session, marks, seen))
        helper.start()
        try:
            yield from compute.run(context=context, payload_path=str(payload),
                                   extra_env={"MARKS": marks}).get_results()
        finally:
            helper.join(300)
        seen["first_workers"] = [job for job in session.io.read().doc.workers
                                 if job != seen.get("gpu_job")]

    (tmp_path / "home").mkdir()
    try:
        with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
            result = dg.materialize([data_pool], resources={"compute": compute},
                                    instance=instance)
            assert result.success
            (event,) = result.get_asset_materialization_events()
            meta = {k: v.value for k, v in event.materialization.metadata.items()}
        with open(os.path.join(marks, "worker-log")) as handle, open(handle.read().strip()) as out:
            log = out.read()
    finally:
        shutil.rmtree(marks, ignore_errors=True)
    assert "error" not in seen, seen
    (gpu_node,) = seen["gpu_ids"]
    head = meta["head_node"]
    # the head's Ray node offers nothing to ask for; no task or actor that asked ran there
    assert meta["head_resources"] == ["dagster_slurm_head=1.0"], meta["head_resources"]
    assert head not in meta["read_nodes"] + meta["first_nodes"] + meta["second_nodes"]
    assert meta["probe_node"] != head
    # the first pool grew onto the added allocation's node; every row came through
    assert meta["first_rows"] == list(range(96))
    assert gpu_node in meta["first_nodes"] and len(meta["first_nodes"]) >= 2, meta
    assert meta["probe_node"] == gpu_node  # accelerator:fake is only there
    # the removal drained the gpu allocation to COMPLETED while the payload went on: the
    # second dataset ran on the rest, its batches after the removal had returned
    assert seen["removed"] == "COMPLETED" == meta["removed_seen"]
    assert seen["gpu_job"] in seen["live_before_removal"]
    assert meta["second_rows"] == list(range(96)) and meta["second_after_removal"]
    assert gpu_node not in meta["second_nodes"]
    assert set(meta["second_nodes"]) <= set(meta["first_nodes"]) - {gpu_node}
    assert "is draining" in log and "is idle and left the Ray cluster" in log, log
    wait_until(lambda: not active_jobs(env, seen["name"]), 60, "the session's jobs to end")
