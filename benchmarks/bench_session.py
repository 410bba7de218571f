"""Run scope against asset scope: N trivial Ray assets in one Dagster run.

For N = 1, 4, 16 (``--sizes``) the same run of N independent Ray assets (each a payload that
connects to Ray and runs one task) is materialised twice on the dev cluster, in one process
with the in-process executor:

* asset scope: one Slurm job per asset, each starting and stopping its own Ray cluster;
* run scope: one allocation for the run, Ray started once, each asset a job step in it.

Printed: wall time of each run, the ratio run/asset (the floor is the asset-scope run
measured in the same invocation), SSH round trips per step and scheduler calls per step
(counted by the transport and the scheduler client; the run-scope figures include the
allocation's submission and startup spread over the N steps, and the teardown's cancel).

Needs the dev cluster (``eval "$(dagster-slurm dev-cluster env)"``) and a cluster-side
environment with ray: ``--env-path`` (pre-deployed) or packed once from
``dagster-pipes`` + ``ray[default,data]==2.60.0`` (cached on the cluster).
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import dagster as dg

from dagster_slurm import (
    ComputeResource,
    RayLauncher,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
)

PAYLOAD = """
import ray
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR")
    value = ray.get(ray.remote(lambda: 1).remote())
    pipes.report_asset_materialization(metadata={"value": value})
"""
RAY_PACKAGES = ["dagster-pipes", "ray[default,data]==2.60.0"]


def _assets(n: int, payload: str) -> list[dg.AssetsDefinition]:
    def make(i: int) -> dg.AssetsDefinition:
        @dg.asset(name=f"ray_{i:02d}")
        def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
            yield from compute.run(context=context, payload_path=payload).get_results()

        return _asset

    return [make(i) for i in range(n)]


def _compute(scope: str, env_path: str | None) -> ComputeResource:
    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION", "cpu"),
                             time_limit="00:20:00", cpus=2, mem="2500M")
    return ComputeResource(
        mode="slurm", slurm=SlurmResource.from_env(queue=queue),
        default_launcher=RayLauncher(include_dashboard=False),
        allocation_scope=scope,
        run_allocation=SlurmRunAllocationConfig() if scope == "run" else None,
        pre_deployed_env_path=env_path, env_packages=None if env_path else RAY_PACKAGES,
    )


def measure(scope: str, n: int, payload: str, env_path: str | None) -> tuple[float, float, float]:
    """(wall seconds, SSH round trips per step, scheduler calls per step) of one run."""
    compute = _compute(scope, env_path)
    transport = compute.slurm.ssh.get_transport()
    scheduler = compute.slurm.scheduler()
    rt0, sc0 = transport.stats.round_trips, scheduler.stats.calls
    start = time.perf_counter()
    result = dg.materialize(_assets(n, payload), resources={"compute": compute})
    elapsed = time.perf_counter() - start
    assert result.success
    return (elapsed, (transport.stats.round_trips - rt0) / n, (scheduler.stats.calls - sc0) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--env-path", default=os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"))
    args = parser.parse_args()
    payload = Path(tempfile.mkdtemp()) / "ray_trivial.py"
    payload.write_text(PAYLOAD)
    # Warm-up: deploys the environment once (cached on the cluster) outside the figures.
    measure("asset", 1, str(payload), args.env_path)
    print(f"{'N':>3} {'asset scope':>12} {'run scope':>10} {'ratio':>6}   round trips/step "
          f"(asset, run)   scheduler calls/step (asset, run)")
    for n in (int(x) for x in args.sizes.split(",")):
        asset_s, asset_rt, asset_calls = measure("asset", n, str(payload), args.env_path)
        run_s, run_rt, run_calls = measure("run", n, str(payload), args.env_path)
        print(f"{n:>3} {asset_s:>11.1f}s {run_s:>9.1f}s {run_s / asset_s:>6.2f}   "
              f"{asset_rt:>6.1f} {run_rt:>6.1f}                  "
              f"{asset_calls:>5.1f} {run_calls:>5.1f}", flush=True)


if __name__ == "__main__":
    main()
