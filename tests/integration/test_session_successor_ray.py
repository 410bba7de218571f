"""A successor with Ray on the dev cluster, inside a real Dagster run (real Ray 2.60).

The asset queues a successor of its run allocation, promotes it once RUNNING (Ray starts in
the successor then, with the session's launcher and environment) and runs a Pipes payload
that uses the successor's Ray cluster; the run tag names the successor.
"""

import time

import dagster as dg
import pytest
from compute_support import ray_processes_of, ray_temp_dirs_of, wait_until
from session_support import RAY_SESSION_PAYLOAD, session_compute

from dagster_slurm import ComputeResource
from dagster_slurm.slurm.states import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def test_promoted_successor_runs_the_payload_on_its_own_ray_cluster(env, tmp_path):
    payload = tmp_path / "ray_session.py"
    payload.write_text(RAY_SESSION_PAYLOAD)
    seen: dict = {}

    @dg.asset
    def relayed(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        first = session.allocation
        successor = session.submit_successor()
        deadline = time.monotonic() + 120
        while successor.state() is not JobState.RUNNING:
            assert time.monotonic() < deadline, "the successor did not start"
            time.sleep(0.5)
        promoted = session.promote_successor()
        seen.update(first=first.job_id, first_ray=first.ray_address,
                    successor=successor.job_id, ray=promoted.ray_address)
        yield from compute.run(context=context, payload_path=str(payload)).get_results()

    compute = session_compute("ray", env)
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        result = dg.materialize([relayed], resources={"compute": compute}, instance=instance)
        assert result.success
        (event,) = result.get_asset_materialization_events()
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
        tags = instance.get_run_by_id(result.run_id).tags
    assert seen["ray"] and seen["ray"] != seen["first_ray"]
    assert meta["slurm_job_id"] == seen["successor"] != seen["first"]
    assert meta["ray_address"] == seen["ray"] and meta["total"] == 14
    assert tags["dagster-slurm/allocation"] == seen["successor"]
    # the promotion released the first allocation: its Ray nodes ended on the HUP to its
    # steps, and each node's shell removed its temp dir, with nothing of the node left to
    # write into it
    first = seen["first"]
    wait_until(lambda: not ray_processes_of(first) and not ray_temp_dirs_of(first), 30,
               f"the Ray nodes of the released allocation {first} to be gone")
    assert ray_temp_dirs_of(first) == []
