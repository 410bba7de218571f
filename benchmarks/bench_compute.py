"""Wall time of compute.run against its floors, round trips per run, Pipes throughput.

Measured A/B in one run (alternating, medians, with the spread of the runs):

* slurm mode: a trivial asset against ``ssh <host> sbatch --wait`` of the same payload
  (OpenSSH client, one login per call, as a user would type it). Target <= 1.3x.
* local mode: the same asset against Dagster's ``PipesSubprocessClient`` running the same
  payload. Target <= 1.1x. Printed with its two parts, both read from the run's events:
  the initialisation of the resource (Dagster builds a configurable resource anew from its
  config schema in every run, so it grows with the schema) and the step itself.
* SSH round trips and scheduler calls per ``compute.run`` (slurm mode).
* Pipes throughput: a payload writing 20,000 log messages at once ("flood"), and one writing
  200 at a pace Dagster keeps up with ("paced"): messages/s into Dagster and the time from
  the payload's last write to the step's end, for local mode, for slurm mode and for the
  floor, ``PipesSubprocessClient`` on the same payload; and, below both, the rate of
  Dagster's own ``context.log.info`` in an asset, which every Pipes log message goes through.

Needs the dev cluster and its environment (``eval "$(dagster-slurm dev-cluster env)"``);
``--env-path`` names a pre-deployed environment on the cluster with dagster-pipes, else
``dagster-pipes`` is packed and deployed once (cached). ``--local-only`` measures only what
needs no cluster (local mode and the throughput floor).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from dagster_slurm import ComputeResource, SlurmQueueConfig, SlurmResource

PAYLOAD = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"ok": 1})
"""
FLOOD_MESSAGES = 20_000
FLOOD = f"""
import time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    for i in range({FLOOD_MESSAGES}):
        pipes.log.info(f"msg {{i}}")
    pipes.report_custom_message({{"last_write": time.time()}})
"""
#: The same kind of messages at a pace Dagster keeps up with (200 in about 1 s): the time
#: from the last write to the step's end is then the latency of the reader and the step's
#: end, not a backlog in Dagster's handler.
PACED = """
import time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    for i in range(200):
        pipes.log.info(f"msg {i}")
        time.sleep(0.005)
    pipes.report_custom_message({"last_write": time.time()})
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


@dataclass(frozen=True)
class Timing:
    """Medians of one arm: whole ``materialize`` call, resource initialisation, step (s),
    and the spread (min, max) of the whole call."""

    total: float
    resources: float
    step: float
    spread: tuple[float, float]


def _event_times(instance: dg.DagsterInstance, run_id: str) -> dict[str, float]:
    """First timestamp of each Dagster event type of the run."""
    times: dict[str, float] = {}
    for entry in instance.all_logs(run_id):
        if entry.dagster_event is not None:
            times.setdefault(entry.dagster_event.event_type_value, entry.timestamp)
    return times


def _timed_run(asset, resources: dict) -> tuple[float, float, float]:
    """One materialize (its ephemeral instance made inside the timing, as materialize would
    make it): wall time, resource initialisation and step time from the run's events."""
    start = time.perf_counter()
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([asset], resources=resources, instance=instance)
    total = time.perf_counter() - start
    events = _event_times(instance, result.run_id)
    return (total, events["RESOURCE_INIT_SUCCESS"] - events["RESOURCE_INIT_STARTED"],
            events["STEP_SUCCESS"] - events["STEP_START"])


def _medians(runs: list[tuple[float, float, float]]) -> Timing:
    totals = [r[0] for r in runs]
    return Timing(statistics.median(totals), statistics.median(r[1] for r in runs),
                  statistics.median(r[2] for r in runs), (min(totals), max(totals)))


def local_vs_subprocess(payload: str, repeat: int) -> tuple[Timing, Timing]:
    """Local mode against ``PipesSubprocessClient`` on ``payload``, alternating."""
    ours_asset, floor_asset = _asset(payload), _subprocess_asset(payload)
    local = ComputeResource(mode="local")
    client = dg.PipesSubprocessClient()
    dg.materialize([ours_asset], resources={"compute": local})
    dg.materialize([floor_asset], resources={"pipes": client})
    ours, floor = [], []
    for _ in range(repeat):
        floor.append(_timed_run(floor_asset, {"pipes": client}))
        ours.append(_timed_run(ours_asset, {"compute": local}))
    return _medians(ours), _medians(floor)


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


@dataclass(frozen=True)
class Throughput:
    """One run of a message payload: messages that reached Dagster, their rate (first to last message's
    event timestamp), the seconds from the payload's last write to the step's end, and the
    step's wall time."""

    count: int
    rate: float
    last_write_to_end: float
    elapsed: float


def _flood_run(asset, resources: dict, last_write: list[float]) -> Throughput:
    instance = dg.DagsterInstance.ephemeral()
    start = time.perf_counter()
    result = dg.materialize([asset], resources=resources, instance=instance)
    elapsed = time.perf_counter() - start
    logs = [e for e in instance.all_logs(result.run_id) if e.user_message.startswith("msg ")]
    end = _event_times(instance, result.run_id)["STEP_SUCCESS"]
    first, last = logs[0].timestamp, logs[-1].timestamp
    return Throughput(len(logs), len(logs) / max(last - first, 1e-9), end - last_write[-1], elapsed)


def throughput(resources: dict[str, ComputeResource | None], flood: str,
               repeat: int) -> dict[str, list[Throughput]]:
    """The message payload ``flood`` through each of ``resources`` (arm name: ``ComputeResource``, or
    ``None`` for the floor, ``PipesSubprocessClient``), alternating, ``repeat`` times."""
    last_write: list[float] = []

    def record(invocation) -> None:
        last_write.extend(m["last_write"] for m in invocation.get_custom_messages())

    @dg.asset(name="bench")
    def ours(context: dg.AssetExecutionContext, compute: ComputeResource):
        invocation = compute.run(context=context, payload_path=flood)
        yield from invocation.get_results()
        record(invocation)

    @dg.asset(name="bench")
    def floor(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient):
        invocation = pipes.run(context=context, command=[sys.executable, flood])
        yield from invocation.get_results()
        record(invocation)

    runs: dict[str, list[Throughput]] = {name: [] for name in resources}
    for _ in range(repeat):
        for name, compute in resources.items():
            if compute is None:
                runs[name].append(_flood_run(floor, {"pipes": dg.PipesSubprocessClient()}, last_write))
            else:
                runs[name].append(_flood_run(ours, {"compute": compute}, last_write))
    return runs


def log_rate(count: int = 2000) -> float:
    """Messages/s of Dagster's own ``context.log.info`` in an asset, without Pipes: what
    Dagster's handler of Pipes log messages (``context.log``) can take at most."""
    rate: list[float] = []

    @dg.asset(name="bench")
    def logs(context: dg.AssetExecutionContext):
        start = time.perf_counter()
        for i in range(count):
            context.log.info(f"msg {i}")
        rate.append(count / (time.perf_counter() - start))

    dg.materialize([logs], instance=dg.DagsterInstance.ephemeral())
    return rate[0]


def _spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def print_throughput(label: str, runs: dict[str, list[Throughput]], *, rates: bool = True) -> None:
    """One line per arm; ``rates`` False for a paced payload, whose rate is its own pace."""
    floor_rate = statistics.median(r.rate for r in runs["floor"])
    for name, arm in runs.items():
        rate = statistics.median(r.rate for r in arm)
        into = (f"{_spread([r.rate for r in arm], '.0f')} messages/s into Dagster (ratio to the "
                f"floor {rate / floor_rate:.2f}), " if rates else "")
        print(f"pipes {label} {name}: {arm[0].count} messages, {into}last write to step end "
              f"{_spread([r.last_write_to_end for r in arm], '.3f')} s, step wall time "
              f"{_spread([r.elapsed for r in arm], '.2f')} s")


def print_local(ours: Timing, floor: Timing) -> None:
    print(f"local mode: trivial asset {ours.total:.3f} s ({ours.spread[0]:.3f}-{ours.spread[1]:.3f}), "
          f"floor PipesSubprocessClient {floor.total:.3f} s ({floor.spread[0]:.3f}-{floor.spread[1]:.3f}), "
          f"ratio {ours.total / floor.total:.2f} (target <= 1.1)")
    print(f"  resource init {ours.resources * 1000:.0f} ms vs {floor.resources * 1000:.0f} ms; "
          f"step {ours.step * 1000:.0f} ms vs {floor.step * 1000:.0f} ms, ratio {ours.step / floor.step:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--flood-repeat", type=int, default=3)
    parser.add_argument("--env-path", default=os.environ.get("DAGSTER_SLURM_TEST_ENV_PATH"))
    parser.add_argument("--local-only", action="store_true",
                        help="only local mode and the throughput floor (no cluster needed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    payload = work / "payload.py"
    payload.write_text(PAYLOAD)
    flood = work / "flood.py"
    flood.write_text(FLOOD)
    paced = work / "paced.py"
    paced.write_text(PACED)
    print_local(*local_vs_subprocess(str(payload), args.repeat))
    arms: dict[str, ComputeResource | None] = {"floor": None, "local": ComputeResource(mode="local")}
    if not args.local_only:
        queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION", "cpu"),
                                 time_limit="00:05:00", cpus=1, mem="500M")
        compute = ComputeResource(
            mode="slurm", slurm=SlurmResource.from_env(queue=queue),
            pre_deployed_env_path=args.env_path,
            env_packages=None if args.env_path else ["dagster-pipes"],
        )
        from dagster_slurm.jobs.activation import activation_for

        class _Ctx:
            log = __import__("logging").getLogger("bench")

        activate = activation_for(compute, _Ctx())
        ours, floor = slurm_vs_sbatch_wait(compute, str(payload), activate, args.repeat)
        print(f"slurm mode: trivial asset {ours:.2f} s, floor `ssh host sbatch --wait` {floor:.2f} s, "
              f"ratio {ours / floor:.2f} (target <= 1.3)")
        rts, calls, by_command = round_trips(compute, str(payload), args.repeat)
        print(f"per compute.run (slurm): {rts} SSH round trips, {calls} scheduler calls "
              f"(last run by command: {by_command})")
        arms["slurm"] = compute
    print_throughput("paced", throughput(arms, str(paced), args.repeat), rates=False)
    print_throughput("flood", throughput(arms, str(flood), args.flood_repeat))
    print(f"Dagster's own context.log.info, no Pipes: {log_rate():.0f} messages/s")


if __name__ == "__main__":
    main()
