"""inspect() and reconcile_workers(): latency, SSH round trips and scheduler RPCs per call, at
1, 10 and 50 worker allocations of one session.

The allocations are real Slurm jobs that wait in the queue (``--begin=now+1hour``, one CPU,
100 MB), submitted by ``reconcile_workers`` itself. Per count, medians of ``--repeat`` calls:

* ``inspect()``: wall time, round trips (target: 1 whatever the count), squeue and sacct
  calls;
* ``reconcile_workers()`` with nothing to do (the count holds): wall time, round trips
  (target: 2), scheduler calls;
* the floor, measured in the same run: ``ssh <host> squeue --name=<session job name>`` with
  the OpenSSH client (one login per call, as a user would type it), and the ratio of each
  call to it.

Needs the dev cluster and its environment (``eval "$(dagster-slurm dev-cluster env)"``).
"""

import argparse
import os
import statistics
import subprocess
import time
import uuid

from dagster_slurm import (
    RayLauncher,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
    WorkerIntent,
)
from dagster_slurm.session.session import RunSession

QUEUED = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1,
                                     gpus_per_node=0, mem="100M", time_limit="00:05:00",
                                     extra_sbatch_directives=["--begin=now+1hour"])


def _session(slurm: SlurmResource) -> RunSession:
    config = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1,
                                      mem="100M", time_limit="00:10:00")
    # no head in this benchmark: no heartbeat or head-check thread
    session = RunSession(slurm, str(uuid.uuid4()), config, RayLauncher(include_dashboard=False),
                         activation=lambda: None, background=False)
    return session


def _measure(session: RunSession, call, repeat: int) -> tuple[float, float, dict[str, float]]:
    scheduler = session.slurm.scheduler()
    transport = scheduler.agent.transport
    times, trips, calls = [], [], []
    for _ in range(repeat):
        before_trips = transport.stats.round_trips
        before = dict(scheduler.stats.by_command)
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        trips.append(transport.stats.round_trips - before_trips)
        calls.append({k: v - before.get(k, 0) for k, v in scheduler.stats.by_command.items()
                      if v - before.get(k, 0)})
    keys = sorted({k for c in calls for k in c})
    rpcs = {k: statistics.median(c.get(k, 0) for c in calls) for k in keys}
    return statistics.median(times), statistics.median(trips), rpcs


def _floor(slurm: SlurmResource, job_name: str, repeat: int) -> float:
    ssh = slurm.ssh
    argv = ["ssh", "-p", str(ssh.port), "-o", "BatchMode=yes"]
    if ssh.key_path:
        argv += ["-i", ssh.key_path]
    if ssh.known_hosts_path:
        argv += ["-o", f"UserKnownHostsFile={ssh.known_hosts_path}"]
    argv += [f"{ssh.user}@{ssh.host}", f"squeue --noheader --name={job_name}"]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,10,50")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    slurm = SlurmResource.from_env(environ=os.environ)
    session = _session(slurm)
    try:
        for count in (int(c) for c in args.counts.split(",")):
            intent = WorkerIntent(key="bench", count=count, config=QUEUED)
            while len(session.reconcile_workers(intent).live) < count:
                pass  # one call submits them all; repeated only if a submission failed
            floor = _floor(slurm, session.job_name, args.repeat)
            seen, trips, rpcs = _measure(session, session.inspect, args.repeat)
            print(f"{count:3d} allocations: inspect {seen * 1000:.0f} ms, {trips:g} round "
                  f"trip(s), scheduler calls {rpcs}; floor `ssh host squeue` "
                  f"{floor * 1000:.0f} ms; ratio {seen / floor:.2f}")
            done, trips, rpcs = _measure(session, lambda i=intent: session.reconcile_workers(i),
                                         args.repeat)
            print(f"{count:3d} allocations: reconcile_workers (count holds) {done * 1000:.0f} ms, "
                  f"{trips:g} round trip(s), scheduler calls {rpcs}; ratio {done / floor:.2f}")
        grow = WorkerIntent(key="bench", count=count + 5, config=QUEUED)
        added, trips, rpcs = _measure(session, lambda: session.reconcile_workers(grow), 1)
        print(f"reconcile_workers submitting 5 more: {added * 1000:.0f} ms, {trips:g} round "
              f"trip(s), scheduler calls {rpcs}")
    finally:
        session.close(cancel=True)
        slurm.close()


if __name__ == "__main__":
    main()
