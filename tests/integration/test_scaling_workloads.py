"""The scaling example's two workloads, driven by real Dagster assets on the dev cluster.

One run (``materialize``, a run-scoped Ray session whose head is not started: the policies
only observe, probe and reconcile) steps through two candidate windows of a GPU node: a
20-minute one, which the batch workload (cheap starts, checkpointed tasks) takes and the
model workload (a 10-minute model load, so at least 40 minutes wanted) declines; then the
dev cluster partitions' own limit of 2 hours, which both take (once the first window's
allocation runs). Each step is inspect ->
estimate_worker_starts -> the example's policy -> reconcile_workers, with real sbatch
--test-only answers and real submissions; teardown cancels the submitted allocations.
"""

import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from session_support import session_compute

from dagster_slurm import ComputeResource

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@dg.asset(deps=["model_requests"])
def workers_running(context: dg.AssetExecutionContext, compute: ComputeResource) -> None:
    """Between the two windows: wait until the allocations submitted so far run, so that the
    next estimates see them placed (a job just queued can make sbatch --test-only plan
    around it; estimates are advisory)."""
    session = compute.get_run_allocation_session(context, start=False)
    deadline = time.monotonic() + 120
    while any(w.state != "RUNNING" for w in session.inspect().workers()):
        assert time.monotonic() < deadline, "the first window's allocations did not start"
        time.sleep(1.0)


def test_a_short_window_is_taken_by_batch_and_declined_by_model_a_long_one_by_both(env):
    sys.path.insert(0, str(EXAMPLES))
    try:
        from dagster_slurm_scaling.definitions import window_assets
    finally:
        sys.path.remove(str(EXAMPLES))
    assets = [*window_assets("00:20:00"), workers_running,
              *window_assets("02:00:00", "_2h", deps=["workers_running"])]
    compute = session_compute("ray", env, time_limit="00:10:00")
    result = dg.materialize(assets, resources={"compute": compute})
    assert result.success

    def seen(name: str) -> dict:
        (mat,) = result.asset_materializations_for_node(name)
        return {key: value.value for key, value in mat.metadata.items()}

    batch, model = seen("batch_tasks"), seen("model_requests")
    batch_2h, model_2h = seen("batch_tasks_2h"), seen("model_requests_2h")
    assert batch["start_in_seconds"] == [0.0] and batch["time_limit_seconds"] == [1200.0]
    assert (batch["count"], len(batch["submitted"])) == (1, 1)
    assert (model["count"], model["submitted"]) == (0, [])  # 20 min < 4 model loads
    assert model_2h["time_limit_seconds"] == [7200.0]
    assert (batch_2h["count"], len(batch_2h["submitted"])) == (2, 1), (
        batch_2h["start_in_seconds"], batch_2h["errors"])
    assert (model_2h["count"], len(model_2h["submitted"])) == (1, 1)
    assert set(batch_2h["live"]) >= set(batch["submitted"])
    for step in (batch, model, batch_2h, model_2h):
        assert step["held_back"] == []
