"""A partitioned asset as one job array, against its floors, measured in one run.

* ours: a single-run backfill of ``--keys`` trivial partitions (``compute.run`` in slurm mode,
  one job array);
* floor: ``ssh <host> sbatch --array=0-<keys-1> --wait`` of a script running the same Python
  (importing dagster_pipes in the same environment), one login, as a user would type it.
  Target: ours <= 1.3x the floor's wall time;
* today's way: ``--singles`` single-partition runs one after another (one job each), the
  figure per run scaled to ``--keys`` runs, and its ratio to ours;
* the scheduler RPCs of the user for the array run (by command), for ``--keys`` and for a
  tenth of it: they should not grow with the number of keys, apart from the submission.

Needs the dev cluster and its environment (``eval "$(dagster-slurm dev-cluster env)"``);
``--env-path`` names a pre-deployed environment on the cluster with dagster-pipes, else
``dagster-pipes`` is packed and deployed once (cached).
"""

import argparse
import logging
import os
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import dagster as dg

from dagster_slurm import ComputeResource, SlurmQueueConfig, SlurmResource

PAYLOAD = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"ok": 1})
"""


def _asset(keys: list[str], payload: str):
    @dg.asset(name="bench", partitions_def=dg.StaticPartitionsDefinition(keys),
              backfill_policy=dg.BackfillPolicy.single_run())
    def bench(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    return bench


def _materialize(asset, compute: ComputeResource, first: str, last: str) -> float:
    start = time.perf_counter()
    result = dg.materialize([asset], resources={"compute": compute}, tags={
        "dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last})
    assert result.success
    return time.perf_counter() - start


def _floor(compute: ComputeResource, activate: str, count: int) -> float:
    slurm = compute.slurm
    remote = f"{slurm.base_path()}/bench-array-floor"
    script = textwrap.dedent(f"""\
        #!/bin/bash
        source {activate}
        python3 -c 'import dagster_pipes'
        """)
    ssh = ["ssh", "-q", "-i", slurm.ssh.key_path, "-p", str(slurm.ssh.port), "-o",
           f"UserKnownHostsFile={slurm.ssh.known_hosts_path}", "-o", "BatchMode=yes",
           f"{slurm.ssh.user}@{slurm.ssh.host}"]
    subprocess.run([*ssh, f"mkdir -p {remote} && cat > {remote}/floor.sh"],
                   input=script.encode(), check=True)
    command = [*ssh, f"sbatch --wait --array=0-{count - 1} -p {slurm.queue.partition} "
                     f"--mem=500M -c 1 -t 10 -o /dev/null {remote}/floor.sh"]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def _rpcs(compute: ComputeResource, asset, first: str, last: str) -> dict[str, int]:
    stats = compute.slurm.scheduler().stats
    before = dict(stats.by_command)
    _materialize(asset, compute, first, last)
    return {k: v - before.get(k, 0) for k, v in stats.by_command.items() if v - before.get(k, 0)}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--singles", type=int, default=20,
                        help="single-partition runs timed for today's way (scaled to --keys)")
    parser.add_argument("--env-path", default=os.environ.get("DAGSTER_SLURM_TEST_ENV_PATH"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    payload = work / "payload.py"
    payload.write_text(PAYLOAD)
    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION", "cpu"),
                             time_limit="00:10:00", cpus=1, mem="500M")
    compute = ComputeResource(mode="slurm", slurm=SlurmResource.from_env(queue=queue),
                              pre_deployed_env_path=args.env_path,
                              env_packages=None if args.env_path else ["dagster-pipes"])
    from dagster_slurm.jobs.activation import activation_for

    class _Ctx:
        log = logging.getLogger("bench")

    activate = activation_for(compute, _Ctx())
    keys = [f"p{i:05d}" for i in range(args.keys)]
    asset = _asset(keys, str(payload))
    _materialize(asset, compute, keys[0], keys[min(9, len(keys) - 1)])  # warm-up
    ours, floor = [], []
    for _ in range(args.repeat):
        floor.append(_floor(compute, activate, args.keys))
        ours.append(_materialize(asset, compute, keys[0], keys[-1]))
    ratio = statistics.median(ours) / statistics.median(floor)
    print(f"{args.keys} partitions as one array: {_spread(ours)}, floor `ssh host sbatch "
          f"--array=0-{args.keys - 1} --wait` {_spread(floor)}, ratio {ratio:.2f} (target <= 1.3)")
    singles = [_materialize(asset, compute, key, key) for key in keys[:args.singles]]
    per_run = statistics.median(singles)
    print(f"today's way: {args.singles} single-partition runs, {per_run:.2f} s each "
          f"({min(singles):.2f}-{max(singles):.2f}); {args.keys} of them about "
          f"{per_run * args.keys:.0f} s, {per_run * args.keys / statistics.median(ours):.1f}x the array")
    tenth = max(2, args.keys // 10)
    print(f"scheduler RPCs of the array run, {args.keys} keys: "
          f"{_rpcs(compute, asset, keys[0], keys[-1])}; {tenth} keys: "
          f"{_rpcs(compute, asset, keys[0], keys[tenth - 1])}")


if __name__ == "__main__":
    main()
