"""The relay example's Dagster definitions: one asset that works through its units over as
many allocations as it takes (see docs/relay.md and examples/README.md)."""

import os
import tempfile
from pathlib import Path

import dagster as dg

from dagster_slurm import (
    ComputeResource,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
)
from dagster_slurm_relay.relay import RelayPolicy, run_relay

PAYLOAD = Path(__file__).parent / "payloads" / "process_units.py"


class RelayConfig(dg.Config):
    """The job's size and the relay policy (seconds before the allocation's end)."""

    work_dir: str = ""
    """Where units are committed; on a filesystem every allocation sees. Empty: a directory
    of the run under the cluster's base path (the temporary directory in local mode)."""
    units: int = 60
    unit_seconds: float = 2.0
    successor_lead: float = 300.0
    drain_lead: float | None = None
    successor_time_limit: str | None = "00:10:00"
    check_interval: float = 10.0
    start_timeout: float = 6 * 3600.0
    cluster_timezone: str | None = None
    max_rounds: int = 10

    def policy(self) -> RelayPolicy:
        return RelayPolicy(
            successor_lead=self.successor_lead, drain_lead=self.drain_lead,
            successor_time_limit=self.successor_time_limit, check_interval=self.check_interval,
            start_timeout=self.start_timeout, cluster_timezone=self.cluster_timezone,
        )


def work_dir_of(config: RelayConfig, compute: ComputeResource, run_id: str) -> str:
    if config.work_dir:
        return config.work_dir
    if compute.mode == "local" or compute.slurm is None:
        return os.path.join(tempfile.gettempdir(), "dagster-slurm-relay", run_id)
    return f"{compute.slurm.base_path()}/relay-units/{run_id}"


@dg.asset(description="Work units processed over as many Slurm allocations as it takes.")
def relayed_units(context: dg.AssetExecutionContext, config: RelayConfig,
                  compute: ComputeResource) -> dg.MaterializeResult:
    work_dir = work_dir_of(config, compute, context.run.run_id)
    outcome = run_relay(
        context, compute, str(PAYLOAD),
        {"work_dir": work_dir, "units": config.units, "unit_seconds": config.unit_seconds},
        config.policy(), max_rounds=config.max_rounds,
    )
    return dg.MaterializeResult(metadata={
        "work_dir": work_dir,
        "units": config.units,
        "allocations": len(outcome.committed_by_allocation()),
        "committed_by_allocation": outcome.committed_by_allocation(),
        "rounds": dg.MetadataValue.json(outcome.rounds),
    })


def relay_compute() -> ComputeResource:
    """Local mode unless DAGSTER_SLURM_MODE=slurm (then the SLURM_EDGE_NODE_* variables):
    a run-scoped allocation with a walltime the example outlasts, on purpose."""
    if os.environ.get("DAGSTER_SLURM_MODE", "local") == "local":
        return ComputeResource(mode="local")
    env_path = os.environ.get("DAGSTER_SLURM_ENV_PATH") or None
    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION") or None,
                             cpus=1, mem="500M")
    return ComputeResource(
        mode="slurm",
        slurm=SlurmResource.from_env(queue=queue),
        allocation_scope="run",
        run_allocation=SlurmRunAllocationConfig(
            time_limit="00:03:00",  # too short for 60 units of 2 s: a successor continues
            signal_before_timeout="TERM@90",  # Slurm sends it 90 to 150 s before the end
        ),
        pre_deployed_env_path=env_path,
        env_packages=None if env_path else ["dagster-pipes"],
    )


defs = dg.Definitions(assets=[relayed_units], resources={"compute": relay_compute()})
