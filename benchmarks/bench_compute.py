"""Wall time of compute.run against its floors, round trips per run, Pipes throughput.

Measured A/B in one run (alternating, medians):

* slurm mode: a trivial asset against ``ssh <host> sbatch --wait`` of the same payload
  (OpenSSH client, one login per call, as a user would type it). Target <= 1.3x.
* local mode: the same asset against Dagster's ``PipesSubprocessClient`` running the same
  payload. Target <= 1.2x.
* SSH round trips and scheduler calls per ``compute.run`` (slurm mode).
* Pipes throughput: a payload writing 20,000 log messages, messages/s into Dagster and the
  time from the payload's last write to the step's end.

Needs the dev cluster and its environment (``eval "$(dagster-slurm dev-cluster env)"``);
``--env-path`` names a pre-deployed environment on the cluster with dagster-pipes, else
``dagster-pipes`` is packed and deployed once (cached).
"""

import argparse
import os
import statistics
import subprocess
import sys
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
FLOOD = """
import time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    for i in range(20000):
        pipes.log.info(f"msg {i}")
    print(f"LAST_WRITE {time.time()}", flush=True)
"""


def _asset(payload: str):
    @dg.asset(name="bench")
    def bench(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    return bench


def _subprocess_asset(payload: str):
    @dg.asset(name="bench")
    def bench(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient):
        yield from pipes.run(context=context, command=[sys.executable, payload]).get_results()

    return bench


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def slurm_vs_sbatch_wait(compute: ComputeResource, payload: str, env_activate: str, repeat: int):
    slurm = compute.slurm
    asset = _asset(payload)
    remote = f"{slurm.base_path()}/bench-floor"
    script = textwrap.dedent(f"""\
        #!/bin/bash
        source {env_activate}
        python3 - <<'PY'
        print("ok")
        PY
        """)
    ssh = ["ssh", "-q", "-i", slurm.ssh.key_path, "-p", str(slurm.ssh.port), "-o",
           f"UserKnownHostsFile={slurm.ssh.known_hosts_path}", "-o", "BatchMode=yes",
           f"{slurm.ssh.user}@{slurm.ssh.host}"]
    subprocess.run([*ssh, f"mkdir -p {remote} && cat > {remote}/floor.sh"], input=script.encode(), check=True)
    floor_cmd = [*ssh, f"sbatch --wait -p {slurm.queue.partition} --mem=500M -c 1 -t 5 "
                       f"-o /dev/null {remote}/floor.sh"]
    ours, floor = [], []
    dg.materialize([asset], resources={"compute": compute})  # warm-up: env, agent, imports
    for _ in range(repeat):
        floor.append(_timed(lambda: subprocess.run(floor_cmd, check=True, capture_output=True)))
        ours.append(_timed(lambda: dg.materialize([asset], resources={"compute": compute})))
    return statistics.median(ours), statistics.median(floor)


def local_vs_subprocess(payload: str, repeat: int):
    ours_asset, floor_asset = _asset(payload), _subprocess_asset(payload)
    local = ComputeResource(mode="local")
    client = dg.PipesSubprocessClient()
    dg.materialize([ours_asset], resources={"compute": local})
    ours, floor = [], []
    for _ in range(repeat):
        floor.append(_timed(lambda: dg.materialize([floor_asset], resources={"pipes": client})))
        ours.append(_timed(lambda: dg.materialize([ours_asset], resources={"compute": local})))
    return statistics.median(ours), statistics.median(floor)


def round_trips(compute: ComputeResource, payload: str, repeat: int):
    counts: list[tuple[int, int, dict]] = []

    @dg.asset(name="bench")
    def bench(context: dg.AssetExecutionContext, compute: ComputeResource):
        transport = compute.slurm.ssh.get_transport()
        scheduler = compute.slurm.scheduler()
        rt0, sc0, by0 = transport.stats.round_trips, scheduler.stats.calls, dict(scheduler.stats.by_command)
        yield from compute.run(context=context, payload_path=payload).get_results()
        by = {k: v - by0.get(k, 0) for k, v in scheduler.stats.by_command.items() if v - by0.get(k, 0)}
        counts.append((transport.stats.round_trips - rt0, scheduler.stats.calls - sc0, by))

    for _ in range(repeat):
        dg.materialize([bench], resources={"compute": compute})
    rts = statistics.median(c[0] for c in counts)
    calls = statistics.median(c[1] for c in counts)
    return rts, calls, counts[-1][2]


def throughput(compute: ComputeResource, flood: str):
    asset = _asset(flood)
    instance = dg.DagsterInstance.ephemeral()
    start = time.perf_counter()
    result = dg.materialize([asset], resources={"compute": compute}, instance=instance)
    elapsed = time.perf_counter() - start
    logs = [e for e in instance.all_logs(result.run_id) if e.user_message.startswith("msg ")]
    first, last = logs[0].timestamp, logs[-1].timestamp
    return len(logs), len(logs) / max(last - first, 1e-9), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--env-path", default=os.environ.get("DAGSTER_SLURM_TEST_ENV_PATH"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    payload = work / "payload.py"
    payload.write_text(PAYLOAD)
    flood = work / "flood.py"
    flood.write_text(FLOOD)
    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION", "cpu"), time_limit="00:05:00",
                             cpus=1, mem="500M")
    compute = ComputeResource(
        mode="slurm", slurm=SlurmResource.from_env(queue=queue),
        pre_deployed_env_path=args.env_path,
        env_packages=None if args.env_path else ["dagster-pipes"],
    )
    from dagster_slurm.compute.environment import activation_for

    class _Ctx:
        log = __import__("logging").getLogger("bench")

    activate = activation_for(compute, _Ctx())
    ours, floor = slurm_vs_sbatch_wait(compute, str(payload), activate, args.repeat)
    print(f"slurm mode: trivial asset {ours:.2f} s, floor `ssh host sbatch --wait` {floor:.2f} s, "
          f"ratio {ours / floor:.2f} (target <= 1.3)")
    ours, floor = local_vs_subprocess(str(payload), args.repeat)
    print(f"local mode: trivial asset {ours:.3f} s, floor PipesSubprocessClient {floor:.3f} s, "
          f"ratio {ours / floor:.2f} (target <= 1.2)")
    rts, calls, by_command = round_trips(compute, str(payload), args.repeat)
    print(f"per compute.run (slurm): {rts} SSH round trips, {calls} scheduler calls "
          f"(last run by command: {by_command})")
    count, rate, elapsed = throughput(compute, str(flood))
    print(f"pipes: {count} messages, {rate:.0f} messages/s into Dagster, step wall time {elapsed:.1f} s")


if __name__ == "__main__":
    main()
