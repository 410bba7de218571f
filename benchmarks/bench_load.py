"""Scheduler citizenship under load: 1, 10 and 50 concurrent ``compute.run`` of one user.

Each level starts that many processes at once (the user's runs), each materializing one
asset whose payload sleeps a little (asset scope, one Slurm job each). Measured per level:

* slurmctld RPCs of the user, from ``sdiag``'s per-user statistics (reset as root before the
  level), as a count and per second of the level's wall time, with the top message types;
* SSH logins, from the dev cluster sshd's log (lines "Accepted publickey" added);
* squeue calls the runs ran themselves, and polls served from the user's shared answer.

The floor is the 1-run level measured in the same invocation: the RPC rate of N runs is
printed as a ratio to it (target: within 2x, and below 1 RPC/s), logins per process against
1. ``--unshared`` repeats the levels with every poll running its own squeue (the shared
answer switched off), for comparison.

Needs the dev cluster and its environment (``eval "$(dagster-slurm dev-cluster env)"``) and
root (``sdiag --reset``); run it while nothing else uses the cluster.
"""


import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = "--worker"


def worker(out: str, sleep: float, shared: bool) -> None:
    """One run: materialize one asset whose payload sleeps ``sleep`` s; write the stats."""
    import dagster as dg

    from dagster_slurm import ComputeResource, SlurmQueueConfig, SlurmResource

    queue = SlurmQueueConfig(partition="cpu", time_limit="00:10:00", mem="100M", cpus=1)
    slurm = SlurmResource.from_env(queue=queue)
    payload = Path(tempfile.mkdtemp()) / "nap.sh"
    payload.write_text(f"#!/bin/bash\nsleep {sleep}\n")
    compute = ComputeResource(mode="slurm", slurm=slurm)

    seen: dict = {}

    @dg.asset(name="nap")
    def nap(context: dg.AssetExecutionContext, compute: ComputeResource):
        scheduler = compute.slurm.scheduler()
        if not shared:
            scheduler.status_path = None  # every poll runs its own squeue
        yield from compute.run(context=context, payload_path=str(payload)).get_results()
        seen["calls"] = dict(scheduler.stats.by_command)

    started = time.time()
    result = dg.materialize([nap], resources={"compute": compute},
                            instance=dg.DagsterInstance.ephemeral())
    stats = {"ok": result.success, "started": started, "ended": time.time(),
             "calls": seen.get("calls", {})}
    Path(out).write_text(json.dumps(stats))


def _sdiag_reset() -> None:
    subprocess.run(["sdiag", "--reset"], check=True, capture_output=True)


def _sdiag(user: str) -> tuple[int, dict[str, int]]:
    """The user's RPC count and the counts by message type (all users) since the reset."""
    text = subprocess.run(["sdiag"], check=True, capture_output=True, text=True).stdout
    count = 0
    by_user = text.split("Remote Procedure Call statistics by user", 1)[-1]
    match = re.search(rf"^\s*{re.escape(user)}\s*\(\s*\d+\)\s*count:(\d+)", by_user, re.M)
    if match:
        count = int(match.group(1))
    by_type = text.split("Remote Procedure Call statistics by message type", 1)[-1]
    by_type = by_type.split("Remote Procedure Call statistics by user", 1)[0]
    types = {m.group(1): int(m.group(2))
             for m in re.finditer(r"^\s*(\w+)\s*\(\s*\d+\)\s*count:(\d+)", by_type, re.M)}
    return count, types


def _logins(log: Path, user: str) -> int:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0
    return text.count(f"Accepted publickey for {user} ")


def level(n: int, sleep: float, shared: bool, user: str, sshd_log: Path,
          timeout: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"load{n}-"))
    logins0 = _logins(sshd_log, user)
    _sdiag_reset()
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, WORKER, str(work / f"{i}.json"),
                               str(sleep), "1" if shared else "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i in range(n)]
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    wall = time.time() - t0
    rpcs, types = _sdiag(user)
    logins = _logins(sshd_log, user) - logins0
    stats = []
    for i in range(n):
        try:
            stats.append(json.loads((work / f"{i}.json").read_text()))
        except (OSError, ValueError):
            pass
    calls: dict[str, int] = {}
    for s in stats:
        for k, v in s["calls"].items():
            calls[k] = calls.get(k, 0) + v
    return {"n": n, "ok": sum(1 for s in stats if s["ok"]), "wall": wall, "rpcs": rpcs,
            "rate": rpcs / wall, "logins": logins, "calls": calls, "types": types}


def _report(rows: list[dict], label: str) -> None:
    floor = rows[0]["rate"] if rows else 0.0
    print(f"\n== {label}")
    print(f"{'runs':>5} {'ok':>4} {'wall s':>7} {'RPCs':>6} {'RPC/s':>7} {'x 1-run':>8} "
          f"{'logins':>7} {'per proc':>8} {'squeue':>7} {'shared':>7} {'sbatch':>7} {'sacct':>6}")
    for r in rows:
        c = r["calls"]
        print(f"{r['n']:>5} {r['ok']:>4} {r['wall']:>7.1f} {r['rpcs']:>6} {r['rate']:>7.3f} "
              f"{r['rate'] / floor if floor else float('nan'):>8.2f} {r['logins']:>7} "
              f"{r['logins'] / r['n']:>8.2f} {c.get('squeue', 0):>7} "
              f"{c.get('squeue_shared', 0):>7} {c.get('sbatch', 0):>7} {c.get('sacct', 0):>6}")
    for r in rows:
        top = sorted(r["types"].items(), key=lambda kv: -kv[1])[:6]
        print(f"  {r['n']:>3} runs, RPCs by type (all users): "
              + ", ".join(f"{k}={v}" for k, v in top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,10,50")
    parser.add_argument("--sleep", type=float, default=5.0, help="payload seconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="per level")
    parser.add_argument("--unshared", action="store_true",
                        help="also run the levels with the shared squeue answer off")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_load needs root for 'sdiag --reset'")
    user = os.environ.get("SLURM_EDGE_NODE_USER", "dslurm")
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        sys.exit('no SLURM_CONF: eval "$(dagster-slurm dev-cluster env)" first')
    sshd_log = Path(conf).parent.parent / "log" / "sshd.log"  # <state dir>/etc/slurm.conf
    levels = [int(x) for x in args.levels.split(",")]
    # one run first, not measured: deploys the environment and the cluster-side program
    level(1, 0.0, True, user, sshd_log, args.timeout)
    modes = [True, False] if args.unshared else [True]
    for shared in modes:
        rows = [level(n, args.sleep, shared, user, sshd_log, args.timeout) for n in levels]
        _report(rows, f"{'shared squeue answer' if shared else 'every poll its own squeue'}, "
                      f"payload sleep {args.sleep:g} s; floor: the 1-run level")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == WORKER:
        worker(sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1")
    else:
        main()
