"""The relay example (examples/dagster_slurm_relay) on the dev cluster, drained on demand.

The example's own asset, policy and payload, in a real Dagster ``materialize``: 24 work
units (of 1 s) with per-unit exclusive-create commits on the shared filesystem. Each allocation
takes both nodes of partition ``cpu``, so the successor the policy queues at once cannot
start while the first allocation holds them: it is still PENDING when the policy calls
``request_drain()`` (170 s before the live ``end_time`` of a 3-minute allocation). The
payload finishes its unit and exits 0 (``SlurmStepDrained``, its reports intact); the relay
releases the drained allocation, waits until the successor is RUNNING, promotes it and runs
the payload again, which skips the committed units. Every unit is committed exactly once and
both allocations did part of the work.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import compute, slurm_resource, squeue_state, wait_until

from dagster_slurm import SlurmRunAllocationConfig
from dagster_slurm.agent import write_file_op
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.launchers.bash import BashLauncher

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from dagster_slurm_relay.definitions import relayed_units  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UNITS = 24  # the drain comes about 10 s in: both allocations do part of the work


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _jobs_in_partition(env: dict[str, str], partition: str) -> list[str]:
    out = subprocess.run([slurm_command(env, "squeue"), "-h", "-p", partition, "-o", "%i %j %T"], capture_output=True,
                         text=True, check=True, env={"SLURM_CONF": env["SLURM_CONF"]}).stdout
    return out.splitlines()


def test_request_drain_with_the_successor_pending_relays_every_unit_once(env):
    # the test needs the whole partition: a job left there would keep the first allocation queued
    wait_until(lambda: not _jobs_in_partition(env, "cpu"), 60,
               f"partition cpu to be free (jobs: {_jobs_in_partition(env, 'cpu')})")
    # cpus=2 and 2500M per node: an allocation of two nodes fills the partition
    slurm = slurm_resource(env, cpus=2, mem="2500M")
    work = f"{slurm.base_path()}/test-marks/relay-drain-{uuid.uuid4().hex[:8]}"  # every node sees it
    slurm.agent().run(write_file_op(f"{work}/.keep", "", makedirs=True))
    resource = compute(
        env, slurm=slurm, default_launcher=BashLauncher(), allocation_scope="run",
        run_allocation=SlurmRunAllocationConfig(
            num_nodes=2, time_limit="00:03:00", heartbeat_interval=5, heartbeat_timeout=120),
    )
    policy = {
        "work_dir": work, "units": UNITS, "unit_seconds": 1.0,
        "successor_lead": 300,  # at once for the first allocation, not for its 10-min successor
        "drain_lead": 170,  # about 10 s after the first allocation started
        "successor_time_limit": "00:10:00", "check_interval": 2, "start_timeout": 180,
    }
    instance = dg.DagsterInstance.ephemeral()
    try:
        result = dg.materialize([relayed_units], resources={"compute": resource}, instance=instance,
                                run_config={"ops": {"relayed_units": {"config": policy}}})
        assert result.success
        (materialization,) = result.asset_materializations_for_node("relayed_units")
        first, second = materialization.metadata["rounds"].value  # two payload runs
        print(f"rounds: {first} / {second}")
        # the first drained on request, with the successor still queued behind it
        assert first["drained"] and first["exit_code"] == 0
        assert first["successor_at_drain"] == "PENDING"
        assert 0 < len(first["units"]) < UNITS
        assert first["remaining"] == UNITS - len(first["units"])  # its completion report
        assert not second["drained"] and second["remaining"] == 0
        assert first["allocation"] != second["allocation"]
        assert sorted(first["units"] + second["units"]) == list(range(UNITS))
        assert not first["duplicates"] and not second["duplicates"]

        # the drained allocation was released before the promotion, which waited for RUNNING
        logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
        released = _index(logs, f"Released the drained allocation {first['allocation']}")
        promoted = _index(logs, f"Promoted successor allocation {second['allocation']}")
        assert released < promoted
        wait_until(lambda: squeue_state(env, first["allocation"]) not in ("RUNNING", "PENDING"),
                   30, "the drained allocation to have ended")
        # it left its nodes by itself on the release (HUP before the scancel), not by the
        # SIGKILL that follows Slurm's KillWait when its shell takes the TERM for a drain
        batch = wait_until(lambda: _batch_exit(env, first["allocation"]), 60,
                           "the accounting record of the drained allocation's batch step",
                           interval=1.0)
        assert not batch.endswith(":9"), f"batch step of {first['allocation']}: {batch}"

        # counted from the commits on the shared filesystem: each unit once, both did work
        commits = sorted(name for name in os.listdir(work) if name.startswith("unit-"))
        assert commits == [f"unit-{u:05d}.json" for u in range(UNITS)]
        by_job = {}
        for name in commits:
            with open(os.path.join(work, name)) as handle:
                record = json.load(handle)
            by_job.setdefault(record["job"], []).append(record["unit"])
        assert by_job == {first["allocation"]: sorted(first["units"]),
                          second["allocation"]: sorted(second["units"])}
    finally:
        slurm.close()
        shutil.rmtree(work, ignore_errors=True)


def _batch_exit(env: dict[str, str], job_id: str) -> str | None:
    """sacct's ExitCode (``status:signal``) of the job's batch step, once it has ended."""
    out = subprocess.run([slurm_command(env, "sacct"), "-n", "-P", "-j", f"{job_id}.batch",
                          "-o", "State,ExitCode"], capture_output=True, text=True,
                         env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.split()
    if not out or out[0].split("|")[0] in ("RUNNING", "PENDING"):
        return None
    return out[0].split("|")[1]


def _index(logs: list[str], text: str) -> int:
    found = [i for i, message in enumerate(logs) if message and text in message]
    assert found, f"no log message contains {text!r}"
    return found[0]
