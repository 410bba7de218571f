"""The head allocation of a Ray run session is cancelled mid-run (real Dagster, Slurm, Ray).

An asset adds a worker allocation on ``gpu`` to a Ray run session whose head runs on
``cpu``, then works through 16 units in a relay loop: ``compute.run`` a payload that
commits each unit once (an exclusive create on the shared filesystem; a second commit of a
unit fails the payload), and on ``SlurmAllocationEnded`` ``session.replace_head()`` and run
again. The test cancels the head after a few units. Every unit is committed exactly once,
the run succeeds, the worker allocation (the only one, hence the one with the most time left) is
elected: it keeps its Slurm job, hosts the head and its node joins it.
"""

import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import slurm_resource, squeue_state, wait_until
from session_support import session_compute

from dagster_slurm import ComputeResource, SlurmAllocationEnded, SlurmWorkerAllocationConfig
from dagster_slurm.agent import write_file_op
from dagster_slurm.devcluster.info import slurm_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UNITS = 16

PAYLOAD = """
import os, time
import ray
from dagster_pipes import open_dagster_pipes

marks, units = os.environ["UNITS_DIR"], int(os.environ["UNITS"])
with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=1)
    def work(unit):
        time.sleep(0.5)
        return unit

    todo = [u for u in range(units) if not os.path.exists(f"{marks}/unit-{u}")]
    for unit in todo:
        ray.get(work.remote(unit))
        # exactly once: a second commit of a unit raises FileExistsError
        fd = os.open(f"{marks}/unit-{unit}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, os.environ["SLURM_JOB_ID"].encode())
        os.close(fd)
    pipes.report_asset_materialization(metadata={"units": len(todo)})
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _ray_head_job(session) -> str:
    text = Path(session.paths.ray_head).read_text() if Path(session.paths.ray_head).exists() else ""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return values.get("job_id", "")


def _joined_head(session, job_id: str) -> set[str]:
    path = Path(session.paths.ray_nodes(job_id))
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return {row[2] for row in rows if len(row) == 3}


@pytest.mark.release_subset
def test_a_cancelled_head_is_replaced_and_every_unit_is_processed_once(env, tmp_path):
    slurm = slurm_resource(env)
    marks = f"{slurm.base_path()}/test-marks/failover-{uuid.uuid4().hex[:8]}"
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    payload = tmp_path / "units.py"
    payload.write_text(PAYLOAD)
    seen: dict = {"heads": []}

    @dg.asset
    def relayed_units(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=1, mem="1500M",
            time_limit="00:10:00"))
        session.wait_for_worker_allocation(worker, timeout=240)
        seen.update(worker=worker.job_id, first=session.allocation.job_id)
        while True:
            try:
                results = compute.run(context=context, payload_path=str(payload),
                                      extra_env={"UNITS_DIR": marks, "UNITS": str(UNITS)},
                                      ).get_results()
                break
            except SlurmAllocationEnded:
                seen["heads"].append(session.replace_head(timeout=300).job_id)
        # before the run's teardown ends every allocation: the worker kept its job and its
        # node follows the elected head
        seen["worker_state"] = squeue_state(env, worker.job_id)
        seen["ray_head"] = _ray_head_job(session)
        seen["joined"] = wait_until(
            lambda: _joined_head(session, worker.job_id) == {session.allocation.job_id}
            and _joined_head(session, worker.job_id), 120,
            "the worker's node to join the elected head")
        yield from results

    def cancel_the_head() -> None:
        wait_until(lambda: "first" in seen, 300, "the asset to start")
        wait_until(lambda: len([n for n in os.listdir(marks) if n.startswith("unit-")]) >= 4,
                   120, "four committed units")
        subprocess.run([slurm_command(env, "scancel"), seen["first"]], env={"SLURM_CONF": env["SLURM_CONF"]},
                       check=True)

    canceller = threading.Thread(target=cancel_the_head, daemon=True)
    canceller.start()
    compute = session_compute("ray", env)
    (tmp_path / "home").mkdir()
    try:
        with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
            result = dg.materialize([relayed_units], resources={"compute": compute},
                                    instance=instance)
            assert result.success
            canceller.join(5)
            committed = sorted(n for n in os.listdir(marks) if n.startswith("unit-"))
            assert committed == sorted(f"unit-{u}" for u in range(UNITS))  # each exactly once
            by_job = {Path(marks, n).read_text() for n in committed}
            assert seen["first"] in by_job and len(by_job) == 2, by_job  # before and after
            assert seen["heads"] and seen["heads"][-1] != seen["first"]
            new_head = seen["heads"][-1]
            assert new_head == seen["worker"]  # elected on the worker allocation, no queue
            assert seen["worker_state"] == "RUNNING"  # same Slurm job throughout
            assert seen["ray_head"] == new_head and seen["joined"] == {new_head}
    finally:
        shutil.rmtree(marks, ignore_errors=True)
