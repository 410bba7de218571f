"""SSH round trips, scheduler calls and latency of each library operation.

The floor is a bare ``true`` exec on the same SSH connection, measured in the same run.
Targets: one round trip and at most one scheduler call per operation, latency within 1.5x
of the floor. Prints a table; exits 0 (this is a measurement, not a test).

Run against the dev cluster (``dagster-slurm dev-cluster up``)::

    eval "$(dagster-slurm dev-cluster env)"
    python benchmarks/bench_operations.py --repeat 20
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

from dagster_slurm import SlurmResource
from dagster_slurm.agent import TailRequest, tail_op
from dagster_slurm.slurm import SbatchSpec
from dagster_slurm.state.store import AgentStateStore


def measure(
    name: str, op: Callable[[], object], slurm: SlurmResource, repeat: int
) -> tuple[str, float, float, float]:
    transport = slurm.ssh.get_transport()
    scheduler = slurm.scheduler()
    op()  # warm-up (first use may install or cache)
    rt0, sc0 = transport.stats.round_trips, scheduler.stats.calls
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    rts = (transport.stats.round_trips - rt0) / repeat
    calls = (scheduler.stats.calls - sc0) / repeat
    return name, statistics.median(times), rts, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    # The submission rate limit (submit_interval, 0.2 s by default) would dominate a tight
    # loop of submissions; it is switched off here to measure the operation itself.
    slurm = SlurmResource.from_env().model_copy(update={"submit_interval": 0.0})
    transport = slurm.ssh.get_transport()
    scheduler = slurm.scheduler()
    agent = slurm.agent()
    work = f"{slurm.base_path()}/bench/{uuid.uuid4().hex[:8]}"
    name = f"bench-{uuid.uuid4().hex[:6]}"
    store = AgentStateStore(agent, work, initial={"schema_version": 1, "n": 0})
    store.transact([{"op": "incr", "path": "/n", "value": 1}])  # creates the directory + doc
    partition = slurm.queue.partition or "cpu"
    job_ids: list[str] = []

    def submit() -> None:
        spec = SbatchSpec(job_name=name, script_path=f"{work}/job.sh", partition=partition,
                          time_limit="00:02:00", output="/dev/null", hold=True)
        job_ids.append(
            scheduler.submit(spec, state_path=f"{work}/job-{len(job_ids)}.json",
                             files={f"{work}/job.sh": ("#!/bin/sh\ntrue\n", 0o755)}).job_id
        )

    rows = [
        measure("floor: bare `true` exec", lambda: transport.run(["true"]), slurm, args.repeat),
        measure("status poll (squeue, all jobs of a name)",
                lambda: scheduler.status([name], job_ids[-3:]), slurm, args.repeat),
        measure("state transaction (lock, read, patch, write)",
                lambda: store.transact([{"op": "incr", "path": "/n", "value": 1}]), slurm, args.repeat),
        measure("state read", lambda: store.load(), slurm, args.repeat),
        measure("tail 3 files from offsets",
                lambda: agent.run(tail_op([TailRequest(f"{work}/job.sh", 0)] * 3)), slurm, args.repeat),
        measure("submit (write script + token + sbatch)", submit, slurm, args.repeat),
        measure("sbatch --test-only estimate",
                lambda: scheduler.test_only(SbatchSpec(job_name=name, script_path="x",
                                                       partition=partition, time_limit="00:01:00")),
                slurm, max(3, args.repeat // 4)),
        measure("cancel every job of a name", lambda: scheduler.cancel(job_name=name), slurm,
                max(3, args.repeat // 4)),
    ]
    scheduler.cancel(job_name=name)
    floor = rows[0][1]
    print(f"{'operation':48} {'median ms':>10} {'x floor':>8} {'round trips':>12} {'sched calls':>12}")
    for label, median, rts, calls in rows:
        print(f"{label:48} {median * 1000:10.1f} {median / floor:8.2f} {rts:12.2f} {calls:12.2f}")
    print(f"\nlogins in this process: {transport.stats.connects}")
    print("round trips on the persistent agent stream count as one each; the floor is a new")
    print("channel + exec of `true`, which is what a one-shot agent call would cost at least.")


if __name__ == "__main__":
    main()
