"""The relay example (examples/dagster_slurm_relay) carried past a real walltime (dev cluster).

The example's own asset, policy and payload with the example's kind of allocation, scaled
down: a 2-minute allocation (the example's is 3 minutes with ``TERM@90``) with
``signal_before_timeout="TERM@78"``, so Slurm itself drains it, 12 to 42 s after the start
(Slurm checks every 30 s and sends the signal up to one check early); the payload's first
unit is committed about 3 s after the start, and 50 units of 1 s outlast the latest drain.
The successor (one node, as the first allocation: the partition has two) was queued at
once and is RUNNING by then. The payload finishes its unit and exits 0
(``SlurmStepDrained``), the relay promotes the successor and runs the payload again; every
unit is committed exactly once, by the two allocations together.
"""

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import compute, slurm_resource

from dagster_slurm import SlurmRunAllocationConfig
from dagster_slurm.agent import write_file_op
from dagster_slurm.launchers.bash import BashLauncher

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from dagster_slurm_relay.definitions import relayed_units  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UNITS = 50


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def test_the_relay_example_over_slurms_own_pre_walltime_signal(env):
    slurm = slurm_resource(env)
    work = f"{slurm.base_path()}/test-marks/relay-example-{uuid.uuid4().hex[:8]}"
    slurm.agent().run(write_file_op(f"{work}/.keep", "", makedirs=True))
    resource = compute(
        env, slurm=slurm, default_launcher=BashLauncher(), allocation_scope="run",
        run_allocation=SlurmRunAllocationConfig(  # relay_compute's, with a shorter walltime
            time_limit="00:02:00", signal_before_timeout="TERM@78",
            heartbeat_interval=5, heartbeat_timeout=120),
    )
    config = {"work_dir": work, "units": UNITS, "unit_seconds": 1.0, "check_interval": 2,
              "start_timeout": 180}
    try:
        result = dg.materialize([relayed_units], resources={"compute": resource},
                                run_config={"ops": {"relayed_units": {"config": config}}})
        assert result.success
        (materialization,) = result.asset_materializations_for_node("relayed_units")
        first, second = materialization.metadata["rounds"].value
        print(f"rounds: {first} / {second}")
        assert first["drained"] and first["exit_code"] == 0
        assert first["successor_at_drain"] is None  # Slurm drained it, not the policy
        assert 0 < len(first["units"]) < UNITS
        assert first["remaining"] == UNITS - len(first["units"])
        assert not second["drained"] and second["remaining"] == 0
        assert sorted(first["units"] + second["units"]) == list(range(UNITS))
        commits = sorted(name for name in os.listdir(work) if name.startswith("unit-"))
        assert commits == [f"unit-{u:05d}.json" for u in range(UNITS)]
        jobs = set()
        for name in commits:
            with open(os.path.join(work, name)) as handle:
                jobs.add(json.load(handle)["job"])
        assert jobs == {first["allocation"], second["allocation"]}
    finally:
        slurm.close()
        shutil.rmtree(work, ignore_errors=True)
