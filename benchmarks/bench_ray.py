"""Ray cluster startup inside a Slurm allocation: RayLauncher against a bare ``ray start``.

Measured A/B in one run (alternating, medians), both in an allocation of the same shape
(``--nodes`` nodes of ``--partition``, ``--cpus`` CPUs and ``--mem`` per node):

* RayLauncher: the job script :class:`~dagster_slurm.launchers.ray.RayLauncher` renders.
* bare: what one would write by hand: ``srun --overlap ... ray start --head --block`` with
  fixed ports, wait until the GCS port answers, ``srun --overlap ... ray start --block
  --address=...`` on the other nodes, wait until each says "Ray runtime started.".

Both run the same probe as payload once the cluster is up. The time reported is from the
first line of the batch script (the job is RUNNING) to the probe's start, i.e. to "every
node has joined and the payload runs"; the probe checks that ``ray.nodes()`` lists them
all, then sums the resident memory of each node's ``ray start`` process tree (all nodes
of the dev cluster share one host, so the probe sees every node's processes).

Needs the dev cluster (``eval "$(dagster-slurm dev-cluster env)"``); ``--env-path`` names a
pre-deployed environment with ray[default] on the cluster, else ray[default,data]==2.60.0 and
dagster-pipes are packed and deployed once (cached). Ray nodes are heavy: this starts one
cluster at a time.
"""

import argparse
import json
import logging
import os
import shlex
import statistics
import subprocess
import textwrap

from dagster_slurm import ComputeResource, SlurmQueueConfig, SlurmResource
from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.ray import RayLauncher

OBJECT_STORE = 300_000_000

PROBE = """\
import json, os, sys, time
started = time.time()
import ray
ray.init(address="auto", logging_level="ERROR")
nodes = [n for n in ray.nodes() if n["Alive"]]
time.sleep(3)
prefix = sys.argv[2]

def processes():
    table = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/status") as f:
                rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        table[int(pid)] = (ppid, cmd, rss)
    return table

table = processes()
memory = {}
for pid, (ppid, cmd, rss) in table.items():
    if " start " in cmd and "--block" in cmd and f"--temp-dir={prefix}" in cmd:
        node = cmd.split(f"--temp-dir={prefix}", 1)[1].split()[0].rsplit("-", 1)[-1]
        tree, total, count = {pid}, 0, 0
        changed = True
        while changed:
            changed = False
            for other, (parent, _, _) in table.items():
                if parent in tree and other not in tree:
                    tree.add(other)
                    changed = True
        for member in tree:
            total += table[member][2]
            count += 1
        memory[node] = {"rss_mib": round(total / 1024), "processes": count}
with open(sys.argv[1], "w") as f:
    json.dump({"joined_at": started, "nodes": len(nodes), "memory": memory}, f)
"""

BARE = """\
#!/bin/bash
# Bare Ray on Slurm: head, wait for its GCS, workers, wait for "Ray runtime started.".
source {activate}
job=$SLURM_JOB_ID
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
cpus=${{SLURM_CPUS_ON_NODE:-1}}
start_node() {{  # index host base extra...
    local index=$1 host=$2 base=$3
    shift 3
    srun --overlap --nodes=1 --ntasks=1 --nodelist="$host" --mem=0 --cpus-per-task="$cpus" \\
        bash -c 'exec ray start --block --disable-usage-stats --node-ip-address="$(hostname -i)" "$@"' \\
        ray "--temp-dir=/tmp/bray-$job-$index" "--num-cpus=$cpus" --num-gpus=0 \\
        "--object-store-memory={store}" "--node-manager-port=$((base + 1))" \\
        "--object-manager-port=$((base + 2))" "--dashboard-agent-listen-port=$((base + 4))" \\
        "--dashboard-agent-grpc-port=$((base + 5))" "--metrics-export-port=$((base + 6))" \\
        "--runtime-env-agent-port=$((base + 7))" "--min-worker-port=$((base + 10))" \\
        "--max-worker-port=$((base + 999))" "$@" > "node-$index.log" 2>&1 &
}}
start_node 0 "${{hosts[0]}}" 35000 --head --port=35000 {dashboard} --ray-client-server-port=35008
head_ip=$(hostname -i)
head_ip=${{head_ip%% *}}
until (: < "/dev/tcp/$head_ip/35000") 2>/dev/null; do sleep 0.2; done
for ((i = 1; i < ${{#hosts[@]}}; i++)); do
    start_node "$i" "${{hosts[i]}}" $((35000 + 1000 * i)) "--address=$head_ip:35000"
done
for ((i = 0; i < ${{#hosts[@]}}; i++)); do
    until grep -q "Ray runtime started" "node-$i.log"; do sleep 0.2; done
done
export RAY_ADDRESS="$head_ip:35000"
python {probe} {result} /tmp/bray-$job-
scancel "$job".0 "$job".1 "$job".2 "$job".3 2>/dev/null
wait
"""

WRAPPER = """\
#!/bin/bash
date +%s.%N > {start}
exec bash {script}
"""


class _Remote:
    """Files and commands on the login node over the OpenSSH client, as the test user."""

    def __init__(self, slurm: SlurmResource) -> None:
        ssh = slurm.ssh
        self.base = slurm.base_path()
        self.ssh = [
            "ssh",
            "-q",
            "-i",
            ssh.key_path,
            "-p",
            str(ssh.port),
            "-o",
            f"UserKnownHostsFile={ssh.known_hosts_path}",
            "-o",
            "BatchMode=yes",
            f"{ssh.user}@{ssh.host}",
        ]

    def run(self, command: str, data: str | None = None) -> str:
        done = subprocess.run(
            [*self.ssh, command], input=data, capture_output=True, text=True, check=True
        )
        return done.stdout

    def write(self, path: str, text: str) -> None:
        self.run(
            f"mkdir -p {shlex.quote(os.path.dirname(path))} && cat > {shlex.quote(path)}", text
        )


def _sbatch(remote: _Remote, directory: str, args: argparse.Namespace, script: str) -> dict:
    start, result = f"{directory}/start", f"{directory}/result.json"
    remote.write(f"{directory}/wrapper.sh", WRAPPER.format(start=start, script=script))
    remote.run(
        f"cd {shlex.quote(directory)} && sbatch --wait --parsable -p {args.partition} "
        f"-N {args.nodes} -c {args.cpus} --mem={args.mem} -t 10 -o out.txt -e err.txt wrapper.sh"
    )
    data = json.loads(remote.run(f"cat {result}"))
    data["elapsed"] = data["joined_at"] - float(remote.run(f"cat {start}"))
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--partition", default=os.environ.get("SLURM_PARTITION", "cpu"))
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--mem", default="3000M")
    parser.add_argument("--env-path", default=os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"))
    parser.add_argument("--no-dashboard", action="store_true", help="heads without dashboard")
    args = parser.parse_args()
    queue = SlurmQueueConfig(partition=args.partition, time_limit="00:10:00")
    compute = ComputeResource(
        mode="slurm",
        slurm=SlurmResource.from_env(queue=queue),
        pre_deployed_env_path=args.env_path,
        env_packages=None if args.env_path else ["dagster-pipes", "ray[default,data]==2.60.0"],
    )
    from dagster_slurm.jobs.activation import activation_for

    class _Context:
        log = logging.getLogger("bench")

    activate = activation_for(compute, _Context())
    assert compute.slurm is not None
    remote = _Remote(compute.slurm)
    root = f"{remote.base}/bench-ray"
    probe = f"{root}/probe.py"
    remote.write(probe, PROBE)
    launcher = RayLauncher(
        object_store_memory=OBJECT_STORE, include_dashboard=not args.no_dashboard
    )
    dashboard = (
        "--include-dashboard=false"
        if args.no_dashboard
        else "--include-dashboard=true --dashboard-port=35003 --dashboard-host=0.0.0.0"
    )
    samples: dict[str, list[dict]] = {"launcher": [], "bare": []}
    for run in range(args.repeat):
        directory = f"{root}/launcher-{run}"
        plan = ExecutionPlan(
            payload=("python", probe, f"{directory}/result.json", "/tmp/dsray-"),
            job_dir=directory,
            status_file=f"{directory}/status",
            drain_file=f"{directory}/drained",
            mode="slurm",
            activation=activate,
            num_nodes=args.nodes,
        )
        remote.write(f"{directory}/job.sh", launcher.render(plan))
        samples["launcher"].append(_sbatch(remote, directory, args, f"{directory}/job.sh"))
        directory = f"{root}/bare-{run}"
        bare = BARE.format(
            activate=shlex.quote(activate),
            store=OBJECT_STORE,
            probe=probe,
            result=f"{directory}/result.json",
            dashboard=dashboard,
        )
        remote.write(f"{directory}/job.sh", textwrap.dedent(bare))
        samples["bare"].append(_sbatch(remote, directory, args, f"{directory}/job.sh"))
    for name, runs in samples.items():
        assert all(sample["nodes"] == args.nodes for sample in runs), (name, runs)
    ours = statistics.median(sample["elapsed"] for sample in samples["launcher"])
    bare = statistics.median(sample["elapsed"] for sample in samples["bare"])
    print(
        f"{args.nodes} nodes x {args.cpus} CPUs ({args.partition}), {args.repeat} run(s) each, "
        f"dashboard {'off' if args.no_dashboard else 'on'}:"
    )
    print(
        f"  RUNNING -> all nodes joined: RayLauncher {ours:.2f} s, bare ray start {bare:.2f} s, "
        f"ratio {ours / bare:.2f}"
    )
    for name, runs in samples.items():
        print(
            f"  {name}: elapsed {[round(s['elapsed'], 2) for s in runs]}, "
            f"memory per node (last run) {runs[-1]['memory']}"
        )


if __name__ == "__main__":
    main()
