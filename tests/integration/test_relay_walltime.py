"""The relay loop in a Dagster asset, carried past a real walltime (dev cluster).

The run allocation has a short time limit and ``signal_before_timeout="TERM@90"``: Slurm
itself sends the drain before the walltime. The payload works through 60 units, committing
each on the shared filesystem; on the drain it finishes its unit, reports how many remain
and exits 0. The asset queues a successor early, catches ``SlurmStepDrained``, promotes the
successor and runs the payload again, which skips the committed units. Every unit is
processed exactly once, counted from the commits.
"""

import json
import os
import shutil
import uuid

import dagster as dg
import pytest
from compute_support import slurm_resource, wait_until

from dagster_slurm import (
    ComputeResource,
    SlurmRunAllocationConfig,
    SlurmStepDrained,
)
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.slurm.states import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UNITS = 60

# Each unit takes 2 s (Slurm sends the drain 30 to 90 s after the start: see below); a commit is a file created exclusively (a second processing of a
# unit would fail to create it and leave a 'twice' marker).
PAYLOAD = """
import os, signal, time
from dagster_pipes import open_dagster_pipes

work = os.environ["RELAY_DIR"]
units = int(os.environ["RELAY_UNITS"])
drained = []
signal.signal(signal.SIGTERM, lambda *_: drained.append(1))
with open_dagster_pipes() as pipes:
    for unit in range(units):
        commit = os.path.join(work, f"unit-{unit:03d}")
        if os.path.exists(commit):
            continue
        if drained:
            break
        time.sleep(2.0)
        try:
            with open(commit, "x") as handle:
                handle.write(os.environ["SLURM_JOB_ID"])
        except FileExistsError:
            open(os.path.join(work, f"twice-{unit:03d}"), "w").close()
        pipes.report_custom_message({"unit": unit, "job": os.environ["SLURM_JOB_ID"]})
    left = sum(not os.path.exists(os.path.join(work, f"unit-{u:03d}")) for u in range(units))
    pipes.report_custom_message({"remaining": left})
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def test_relay_over_a_real_pre_walltime_signal_processes_every_unit_once(env, tmp_path):
    slurm = slurm_resource(env)
    work = f"{slurm.base_path()}/test-marks/relay-{uuid.uuid4().hex[:8]}"  # seen by every node
    from dagster_slurm.agent import write_file_op

    slurm.agent().run(write_file_op(f"{work}/.keep", "", makedirs=True))
    payload = tmp_path / "units.py"
    payload.write_text(PAYLOAD)
    seen: dict = {"drained": [], "jobs": []}

    @dg.asset
    def relayed(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        extra = {"RELAY_DIR": work, "RELAY_UNITS": str(UNITS)}
        # queued early, so that it runs when the drain comes
        successor = session.submit_successor(SlurmRunAllocationConfig(time_limit="00:10:00"))
        for _attempt in range(3):
            seen["jobs"].append(session.allocation.job_id)
            try:
                completed = compute.run(context=context, payload_path=str(payload),
                                        extra_env=extra)
            except SlurmStepDrained as drained:
                reports = drained.invocation.get_custom_messages()
                seen["drained"].append((drained.result.exit_code, reports))
                wait_until(lambda s=successor: s.state() is JobState.RUNNING, 120,
                           "the successor to run")
                session.promote_successor()
                continue
            reports = completed.get_custom_messages()
            assert reports[-1] == {"remaining": 0}
            return dg.MaterializeResult(metadata={"allocations": json.dumps(seen["jobs"])})
        raise AssertionError("the relay did not finish in the successor")

    compute = ComputeResource(
        mode="slurm", slurm=slurm, default_launcher=BashLauncher(), allocation_scope="run",
        env_packages=["dagster-pipes"],
        run_allocation=SlurmRunAllocationConfig(
            # Slurm signals 90 s before the walltime, up to 60 s earlier: after 30-90 s
            time_limit="00:03:00", signal_before_timeout="TERM@90",
            heartbeat_interval=5, heartbeat_timeout=120,
        ),
    )
    try:
        result = dg.materialize([relayed], resources={"compute": compute})
        assert result.success
        ((exit_code, reports),) = seen["drained"]  # one drain, by Slurm's own signal
        assert exit_code == 0
        done_first = [r["unit"] for r in reports if "unit" in r]
        assert done_first and reports[-1]["remaining"] == UNITS - len(done_first)
        assert len(set(seen["jobs"])) == 2
        commits = sorted(name for name in os.listdir(work) if name.startswith("unit-"))
        assert commits == [f"unit-{u:03d}" for u in range(UNITS)]
        assert not [name for name in os.listdir(work) if name.startswith("twice-")]
        by_job = {open(os.path.join(work, name)).read() for name in commits}
        assert by_job == set(seen["jobs"])  # both allocations did part of the work
    finally:
        slurm.close()
        shutil.rmtree(work, ignore_errors=True)
