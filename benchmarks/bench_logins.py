"""SSH logins of a Dagster deployment per day, with and without the shared login, and the
latency of one command through the shared login against a direct paramiko channel.

**Logins.** A deployment with the orphan sensor ticking every 30 s and 20 runs an hour of 3
steps each under the multiprocess executor (one process per run, one per step), played
faster: one simulated hour takes ``--hour-seconds`` (default 360 s, a tenth of an hour), so
the sensor ticks every 3 s and a run starts every 18 s. The sensor is evaluated in one
long-lived process (the code server); each run is a process of its own executing a job of
three chained Slurm assets with the multiprocess executor. Logins are counted from the dev
cluster sshd's log ("Accepted ..." lines added during the hour), once with every process
logging in itself (``shared_login="off"``) and once after one ``dagster-slurm login``
(counted in), then extrapolated to a day (x24). The published peer's figure for the sensor
alone is ~2,880 logins a day (one per tick). Target with the shared login: 1 per machine per
ControlPersist period.

**Latency.** ``true`` run ``--commands`` times through each transport, already logged in,
and one line echoed through a long-lived stream (the way the library's agent is used),
medians with the spread; the paramiko channel is the floor (target: <= 1.5x).

Needs the dev cluster and its environment (``eval "$(dagster-slurm dev-cluster env)"``);
run it while nothing else uses the cluster.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RUN = "--run"
SENSOR = "--sensor"
PAYLOAD = "#!/bin/bash\ntrue\n"


def _compute(mode: str):  # noqa: ANN202 - the resource, built in the worker processes
    from dagster_slurm import ComputeResource, SlurmQueueConfig, SlurmResource
    queue = SlurmQueueConfig(partition="cpu", time_limit="00:05:00", mem="100M", cpus=1)
    # from settings (not model_copy): Dagster rebuilds a run's resources from them
    environ = {**os.environ, "SLURM_EDGE_NODE_SHARED_LOGIN": mode}
    return ComputeResource(mode="slurm", slurm=SlurmResource.from_env(queue=queue,
                                                                      environ=environ))


def bench_job():  # noqa: ANN201 - a Dagster job, reconstructed in every step process
    import dagster as dg

    from dagster_slurm import ComputeResource

    payload = Path(os.environ["BENCH_LOGINS_PAYLOAD"])

    def step(name: str, upstream: str | None):  # noqa: ANN202
        deps = [upstream] if upstream else []

        @dg.asset(name=name, deps=deps)
        def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):  # noqa: ANN202
            yield from compute.run(context=context, payload_path=str(payload)).get_results()

        return _asset

    assets = [step("first", None), step("second", "first"), step("third", "second")]
    return dg.Definitions(
        assets=assets,
        resources={"compute": _compute(os.environ["BENCH_LOGINS_MODE"])},
        jobs=[dg.define_asset_job("three_steps", executor_def=dg.multiprocess_executor)],
    ).resolve_job_def("three_steps")


def run_worker() -> None:
    """One run: the three-step job under the multiprocess executor."""
    import dagster as dg

    with dg.DagsterInstance.local_temp(tempfile.mkdtemp()) as instance:
        result = dg.execute_job(dg.reconstructable(bench_job), instance=instance)
        sys.exit(0 if result.success else 1)


def sensor_worker(interval: float, duration: float) -> None:
    """The code server's part: one process evaluating the orphan sensor every ``interval``."""
    import dagster as dg

    from dagster_slurm import build_slurm_orphan_reconcile_sensor

    compute = _compute(os.environ["BENCH_LOGINS_MODE"])
    sensor = build_slurm_orphan_reconcile_sensor(slurm=compute.slurm)
    ticks = 0
    end = time.monotonic() + duration
    with dg.DagsterInstance.ephemeral() as instance:
        while time.monotonic() < end:
            started = time.monotonic()
            sensor(dg.build_sensor_context(instance=instance))
            ticks += 1
            time.sleep(max(interval - (time.monotonic() - started), 0.0))
    print(f"ticks={ticks}")


def _logins(log: Path) -> int:
    try:
        return sum(1 for line in log.read_text(errors="replace").splitlines()
                   if "Accepted " in line)
    except OSError:
        return 0


def _hour(mode: str, hour_seconds: float, log: Path, env: dict[str, str]) -> dict[str, float]:
    """One simulated hour; the logins it made and how its runs ended."""
    before = _logins(log)
    env = {**env, "BENCH_LOGINS_MODE": mode}
    sensor = subprocess.Popen([sys.executable, __file__, SENSOR, str(30 * hour_seconds / 3600),
                               str(hour_seconds)], env=env, stdout=subprocess.PIPE, text=True)
    runs: list[subprocess.Popen] = []
    gap = hour_seconds / 20
    start = time.monotonic()
    for index in range(20):
        time.sleep(max(start + index * gap - time.monotonic(), 0.0))
        runs.append(subprocess.Popen([sys.executable, __file__, RUN], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    failed = sum(1 for run in runs if run.wait() != 0)
    if failed:
        print(f"  {failed} runs failed; run one by hand: BENCH_LOGINS_MODE={mode} "
              f"BENCH_LOGINS_PAYLOAD=... python {__file__} {RUN}")
    ticks_text = sensor.communicate()[0]
    ticks = int(ticks_text.strip().rpartition("=")[2] or 0)
    return {"logins": _logins(log) - before, "failed_runs": failed, "ticks": ticks,
            "seconds": time.monotonic() - start}


def _latency(commands: int) -> dict[str, list[float]]:
    from dagster_slurm.resources.ssh import SSHConnectionResource
    from dagster_slurm.transport.openssh import OpenSSHTransport
    from dagster_slurm.transport.ssh import SSHTransport

    ssh = SSHConnectionResource.from_env()
    paramiko_transport = SSHTransport(ssh.to_target(), ssh.to_options())
    shared = OpenSSHTransport(ssh.to_target(), ssh.to_options())
    out: dict[str, list[float]] = {}
    for name, transport in (("paramiko", paramiko_transport), ("shared", shared)):
        transport.run(["true"])  # logged in / warmed up
        times = []
        for _ in range(commands):
            began = time.perf_counter()
            transport.run(["true"])
            times.append(time.perf_counter() - began)
        out[f"{name} command"] = times
        stream = transport.open_stream(["cat"])
        times = []
        for _ in range(commands):
            began = time.perf_counter()
            stream.send(b"ping\n")
            stream.readline(30)
            times.append(time.perf_counter() - began)
        stream.close()
        out[f"{name} stream line"] = times
    paramiko_transport.close()
    return out


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    return (f"median {statistics.median(ordered) * 1000:.2f} ms "
            f"(p10 {ordered[len(ordered) // 10] * 1000:.2f}, "
            f"p90 {ordered[len(ordered) * 9 // 10] * 1000:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hour-seconds", type=float, default=360.0)
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--skip-logins", action="store_true")
    args = parser.parse_args()
    from dagster_slurm.devcluster.layout import DEFAULT_STATE_DIR

    log = Path(os.environ.get("DAGSTER_SLURM_DEV_STATE_DIR", DEFAULT_STATE_DIR)) / "log" / "sshd.log"
    login_dir = tempfile.mkdtemp(prefix="bl-", dir="/tmp")
    env = {**os.environ, "DAGSTER_SLURM_LOGIN_DIR": login_dir}
    payload = Path(login_dir) / "payload.sh"
    payload.write_text(PAYLOAD)
    env["BENCH_LOGINS_PAYLOAD"] = str(payload)

    os.environ["DAGSTER_SLURM_LOGIN_DIR"] = login_dir
    subprocess.run([sys.executable, "-m", "dagster_slurm.cli", "login"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    lat = _latency(args.commands)
    print("latency of one command, already logged in:")
    for name, values in lat.items():
        print(f"  {name:22s} {_spread(values)}")
    for kind in ("command", "stream line"):
        ratio = statistics.median(lat[f"shared {kind}"]) / statistics.median(lat[f"paramiko {kind}"])
        print(f"  shared / paramiko ({kind}): {ratio:.2f}x  (target <= 1.5x)")
    subprocess.run([sys.executable, "-m", "dagster_slurm.cli", "logout"], env=env,
                   stdout=subprocess.DEVNULL, check=False)
    if args.skip_logins:
        return
    scale = 3600 / args.hour_seconds
    print(f"\none simulated hour = {args.hour_seconds:.0f} s: sensor every "
          f"{30 / scale:.1f} s, 20 runs of 3 steps (multiprocess executor)")
    off = _hour("off", args.hour_seconds, log, env)
    before = _logins(log)
    subprocess.run([sys.executable, "-m", "dagster_slurm.cli", "login"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    login_itself = _logins(log) - before
    shared = _hour("auto", args.hour_seconds, log, env)
    subprocess.run([sys.executable, "-m", "dagster_slurm.cli", "logout"], env=env,
                   stdout=subprocess.DEVNULL, check=False)
    shared["logins"] += login_itself
    for name, hour in (("every process logs in", off), ("shared login", shared)):
        print(f"  {name:22s} logins in the hour {hour['logins']:4.0f}  per day "
              f"{hour['logins'] * 24:6.0f}  (sensor ticks {hour['ticks']:.0f}, failed runs "
              f"{hour['failed_runs']:.0f}, {hour['seconds']:.0f} s)")
    print("  published peer, sensor alone: ~2880 per day")
    print(f"  shared login: {shared['logins']:.0f} login(s) for the whole hour "
          "(target: 1 per machine per ControlPersist period)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == RUN:
        run_worker()
    elif len(sys.argv) > 1 and sys.argv[1] == SENSOR:
        sensor_worker(float(sys.argv[2]), float(sys.argv[3]))
    else:
        threading.current_thread().name = "bench"
        main()
