"""Worker allocations: scale-out and head failover against a bare ``ray start``.

One run session per repetition (a RayLauncher head on ``cpu``, one node) on the dev cluster:

* scale-out: a driver step on the head waits for a task that needs
  ``{"dagster_slurm_worker": 1}``; then ``add_worker_allocation`` (one free ``gpu`` node).
  ``joined``: seconds until ``wait_for_worker_allocation`` returned; ``usable``: until that
  task returned (its time is read in the driver, on the node's clock, which is this
  machine's on the dev cluster).
* failover: the head allocation is cancelled (``scancel``); seconds until
  ``replace_head()`` returned (``head``) and until the worker allocation's ``ray_nodes``
  names the new head's job id (``rejoined``: every worker node is in the new head's Ray
  cluster). The path taken is printed: ``worker-hosted`` when the new head's job id is the
  worker allocation's (its one node then is the head: ``rejoined`` equals ``head``), else
  ``new allocation`` (a new allocation shaped like the first head).

``joined`` includes the poll interval of ``wait_for_worker_allocation`` (it backs off from
1 s to 10 s), so it may exceed ``usable``, which the waiting task sees at once.

Floor, measured in the same run: plain sbatch jobs with the same Ray of the deployed
environment: a bare ``ray start --head`` on ``cpu`` whose driver waits for tasks that need a
custom resource, and bare ``ray start --address=...`` workers on ``gpu`` offering it.
``failover`` floor: head and worker job submitted together (the worker waits for the
head's address), seconds to the first task on the worker returned; ``scale-out`` floor: a
second worker job submitted while that head runs, seconds to a task on it returned.

Needs the dev cluster (``eval "$(dagster-slurm dev-cluster env)"``) and a cluster-side
environment with ray: ``--env-path`` (pre-deployed, default
``$DAGSTER_SLURM_TEST_RAY_ENV_PATH``) or packed from ``dagster-pipes`` +
``ray[default,data]==2.60.0`` (cached on the cluster). Every job is cancelled by name at the end
of each repetition, also on errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dagster_slurm import (
    ComputeResource,
    RayLauncher,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
)
from dagster_slurm.jobs.activation import activation_for
from dagster_slurm.session.session import RunSession
from dagster_slurm.session.workers.submit import WorkerAllocation

RAY_PACKAGES = ["dagster-pipes", "ray[default,data]==2.60.0"]
LOG = logging.getLogger("bench_workers")
#: Bound of every wait of one repetition (seconds).
TIMEOUT = 300.0

#: Step on the head: Ray up, a ready mark, then a task that needs a worker node's resource.
WAITING_DRIVER = """
import json, sys, time, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
open(sys.argv[1], "w").write("ready\\n")

@ray.remote(resources={"dagster_slurm_worker": 1}, num_cpus=0, max_retries=0)
def where():
    return ray.get_runtime_context().get_node_id()

node = ray.get(where.remote())
print(json.dumps({"returned": time.time(), "node": node}))
"""

#: Floor driver (in the bare head job): one task per worker job, each needing its resource;
#: writes ``returned-<n>`` (epoch seconds) once task n returned.
FLOOR_DRIVER = """
import os, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
for n in (1, 2):
    @ray.remote(resources={f"bench_worker_{n}": 1}, num_cpus=0, max_retries=0)
    def where():
        return ray.get_runtime_context().get_node_id()
    ray.get(where.remote())
    with open(f"{sys.argv[2]}/returned-{n}.tmp", "w") as f:
        f.write(f"{time.time()}\\n")
    os.replace(f"{sys.argv[2]}/returned-{n}.tmp", f"{sys.argv[2]}/returned-{n}")
"""

#: Options shared by bare Ray nodes; every node of the dev cluster is on one host, so each
#: gets its own port block from ``base``.
BARE_NODE = """\
ip=$(hostname -i); ip=${{ip%% *}}
node_args=(--disable-usage-stats --node-ip-address="$ip" --temp-dir="/tmp/bwork-$SLURM_JOB_ID"
    --num-cpus=2 --num-gpus=0 --object-store-memory=300000000
    --node-manager-port=$((base + 1)) --object-manager-port=$((base + 2))
    --dashboard-agent-listen-port=$((base + 4)) --dashboard-agent-grpc-port=$((base + 5))
    --metrics-export-port=$((base + 6)) --runtime-env-agent-port=$((base + 7))
    --min-worker-port=$((base + 10)) --max-worker-port=$((base + 999)))
"""

BARE_HEAD = """\
#!/bin/bash
source {activate}
dir={dir}
base=36000
{node}
ray start --head --block --port=$base --include-dashboard=false \\
    --ray-client-server-port=$((base + 8)) "${{node_args[@]}}" > "$dir/head.log" 2>&1 &
until (: < "/dev/tcp/$ip/$base") 2>/dev/null; do sleep 0.2; done
echo "$ip:$base" > "$dir/address.tmp" && mv "$dir/address.tmp" "$dir/address"
python {driver} "$ip:$base" "$dir"
wait
"""

BARE_WORKER = """\
#!/bin/bash
source {activate}
dir={dir}
base=$((36000 + 1000 * {n}))
{node}
until [ -s "$dir/address" ]; do sleep 0.2; done
exec ray start --block --address="$(cat "$dir/address")" \\
    --resources='{{"bench_worker_{n}": 1}}' "${{node_args[@]}}" > "$dir/worker-{n}.log" 2>&1
"""


class _Remote:
    """Commands on the login node over the OpenSSH client, as the cluster user."""

    def __init__(self, slurm: SlurmResource) -> None:
        ssh = slurm.ssh
        self.base = slurm.base_path()
        self.ssh = ["ssh", "-q", "-i", ssh.key_path, "-p", str(ssh.port),
                    "-o", f"UserKnownHostsFile={ssh.known_hosts_path}", "-o", "BatchMode=yes",
                    f"{ssh.user}@{ssh.host}"]

    def run(self, command: str, data: str | None = None, check: bool = True) -> str:
        done = subprocess.run([*self.ssh, command], input=data, capture_output=True, text=True,
                              check=check, timeout=60)
        return done.stdout

    def write(self, path: str, text: str) -> None:
        self.run(f"mkdir -p {shlex.quote(os.path.dirname(path))} && cat > {shlex.quote(path)}",
                 text)

    def read(self, path: str) -> str:
        return self.run(f"cat {shlex.quote(path)} 2>/dev/null", check=False)

    def cancel(self, name: str) -> None:
        """Cancel every job named ``name`` and wait (bounded) until none is left, so that
        the next measurement finds its nodes free."""
        self.run(f"scancel --name={shlex.quote(name)}", check=False)
        _wait_for(lambda: not self.run(f"squeue -h -o %i --name={shlex.quote(name)}",
                                       check=False).strip(),
                  f"the jobs named {name} to end", timeout=120, every=1.0)


def _wait_for(probe: Callable[[], Any], what: str, timeout: float = TIMEOUT,
              every: float = 0.2) -> Any:
    """``probe()``'s first truthy value, polled every ``every`` s; RuntimeError after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def _worker_config(**fields: Any) -> SlurmWorkerAllocationConfig:
    return SlurmWorkerAllocationConfig(partition="gpu", num_nodes=1, cpus_per_task=2,
                                       gpus_per_node=0, mem="1500M", time_limit="00:10:00",
                                       **fields)


def _session(slurm: SlurmResource, activation: str) -> RunSession:
    config = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=2,
                                      mem="2500M", time_limit="00:10:00",
                                      heartbeat_timeout=300, heartbeat_interval=5)
    return RunSession(slurm, str(uuid.uuid4()), config, RayLauncher(include_dashboard=False),
                      activation=lambda: activation)


def _head_of(session: RunSession, job_id: str) -> set[str]:
    """Head job ids named by the worker allocation ``job_id``'s ray_nodes lines."""
    rows = [line.split() for line in session.io.read_lines(session.paths.ray_nodes(job_id))]
    return {row[2] for row in rows if len(row) == 3}


def _scale_out(session: RunSession, remote: _Remote, figures: dict[str, Any]) -> WorkerAllocation:
    """Add a worker allocation while a driver step waits for a task there; sets ``joined``
    and ``usable``; the allocation's handle."""
    mark = f"{session.paths.session_dir}/bench-ready"
    outcome: dict[str, Any] = {}

    def drive() -> None:
        try:
            outcome["result"] = session.execute_in_session(
                ["python", "-c", WAITING_DRIVER, mark], name="bench-driver")
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    _wait_for(lambda: remote.read(mark).strip() == "ready", "the driver step on the head",
              every=0.5)
    start = time.time()
    worker = session.add_worker_allocation(_worker_config())
    ids = session.wait_for_worker_allocation(worker, timeout=TIMEOUT)
    figures["joined"] = time.time() - start
    driver.join(TIMEOUT)
    if driver.is_alive() or "error" in outcome:
        raise RuntimeError(f"the driver step did not finish: {outcome}")
    result = outcome["result"]
    lines = [line for line in result.stdout_tail.splitlines() if line.startswith("{")]
    if result.exit_code != 0 or not lines:
        raise RuntimeError(f"the driver step failed: {result}")
    data = json.loads(lines[-1])
    if data["node"] not in ids:
        raise RuntimeError(f"the task ran on {data['node']}, not on the worker {ids}")
    figures["usable"] = data["returned"] - start
    return worker


class _Timeline:
    """A logger for ``replace_head`` that keeps each message with its seconds since
    ``start`` in ``figures["timeline"]`` (printed: where the failover's time goes)."""

    def __init__(self, start: float, figures: dict[str, Any]) -> None:
        self.start = start
        self.lines: list[str] = figures.setdefault("timeline", [])

    def _keep(self, message: str, *args: Any) -> None:
        self.lines.append(f"{time.time() - self.start:5.2f} s  {message % args if args else message}")

    info = warning = debug = error = _keep


def _failover(session: RunSession, remote: _Remote, worker: WorkerAllocation,
              figures: dict[str, Any]) -> None:
    """Cancel the head, elect a new one, wait for the worker to follow it; sets ``head``,
    ``rejoined``, ``path``, ``jobs``."""
    old = session.current_allocation()
    assert old is not None
    start = time.time()
    remote.run(f"scancel {old.job_id}")
    head = session.replace_head(timeout=TIMEOUT, logger=_Timeline(start, figures))
    figures["head"] = time.time() - start
    hosted = head.job_id == worker.job_id
    if not (hosted and worker.config.num_nodes == 1):  # else its one node is the head
        _wait_for(lambda: _head_of(session, worker.job_id) == {head.job_id},
                  "the worker node to rejoin the new head", every=0.5)
    figures["rejoined"] = time.time() - start
    session.wait_for_worker_allocation(worker, timeout=60)
    figures["path"] = "worker-hosted" if hosted else "new allocation"
    figures["jobs"] = f"head {old.job_id} -> {head.job_id}, worker {worker.job_id}"


def measure_session(slurm: SlurmResource, remote: _Remote, activation: str) -> dict[str, Any]:
    """One run session: scale-out (joined, usable) and failover (head, rejoined, path)."""
    session = _session(slurm, activation)
    figures: dict[str, Any] = {}
    try:
        session.ensure()
        worker = _scale_out(session, remote, figures)
        _failover(session, remote, worker, figures)
        return figures
    finally:
        name = session.job_name
        try:
            session.close(cancel=True)
        finally:
            remote.cancel(name)


def measure_floor(remote: _Remote, activation: str, run: int) -> dict[str, float]:
    """Bare Ray: ``failover`` (head + worker submitted together -> task on the worker) and
    ``scale`` (a second worker submitted -> task on it)."""
    name = f"bench-workers-floor-{uuid.uuid4().hex[:8]}"
    directory = f"{remote.base}/bench-workers/floor-{run}-{name[-8:]}"
    driver = f"{directory}/driver.py"
    remote.write(driver, FLOOR_DRIVER)
    node = BARE_NODE.format()
    quoted = shlex.quote(activation)
    remote.write(f"{directory}/head.sh", BARE_HEAD.format(
        activate=quoted, dir=directory, node=node, driver=driver))
    for n in (1, 2):
        remote.write(f"{directory}/worker-{n}.sh", BARE_WORKER.format(
            activate=quoted, dir=directory, node=node, n=n))

    def sbatch(partition: str, mem: str, script: str) -> str:
        return (f"sbatch --parsable --job-name={name} -p {partition} -N 1 -c 2 --mem={mem} "
                f"-t 10 -o {directory}/{script}.out {directory}/{script}.sh")

    def returned(n: int) -> float:
        return float(_wait_for(lambda: remote.read(f"{directory}/returned-{n}").strip(),
                               f"the bare task on worker {n}", every=0.5))

    try:
        figures: dict[str, float] = {}
        start = time.time()
        remote.run(f"cd {shlex.quote(directory)} && {sbatch('cpu', '2500M', 'head')} && "
                   f"{sbatch('gpu', '1500M', 'worker-1')}")
        figures["failover"] = returned(1) - start
        start = time.time()
        remote.run(sbatch("gpu", "1500M", "worker-2"))
        figures["scale"] = returned(2) - start
        return figures
    finally:
        remote.cancel(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repeat", nargs="?", type=int, default=2, help="repetitions (median)")
    parser.add_argument("--env-path", default=os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"))
    args = parser.parse_args()
    slurm = SlurmResource.from_env(queue=SlurmQueueConfig(partition="cpu", time_limit="00:10:00"))
    compute = ComputeResource(mode="slurm", slurm=slurm, pre_deployed_env_path=args.env_path,
                              env_packages=None if args.env_path else RAY_PACKAGES)
    activation = activation_for(compute, SimpleNamespace(log=LOG))
    remote = _Remote(slurm)
    ours: list[dict[str, Any]] = []
    floors: list[dict[str, float]] = []
    try:
        for run in range(args.repeat):
            floors.append(measure_floor(remote, activation, run))
            ours.append(measure_session(slurm, remote, activation))
            timeline = ours[-1].pop("timeline", [])
            shown = {k: round(v, 1) if isinstance(v, float) else v for k, v in ours[-1].items()}
            print(f"run {run + 1}: {shown}; floor "
                  f"{ {k: round(v, 1) for k, v in floors[-1].items()} }", flush=True)
            print("  failover, seconds after the head's scancel:", flush=True)
            for line in timeline:
                print(f"    {line}", flush=True)
    finally:
        slurm.close()

    def median(samples: list[dict[str, Any]], key: str) -> float:
        return statistics.median(sample[key] for sample in samples)

    floor_scale, floor_failover = median(floors, "scale"), median(floors, "failover")
    print(f"median of {args.repeat} run(s); head on cpu, one worker node on gpu, 2 CPUs each:")
    for label, key, floor in (("scale-out joined", "joined", floor_scale),
                              ("scale-out usable", "usable", floor_scale),
                              ("failover head", "head", floor_failover),
                              ("failover rejoined", "rejoined", floor_failover)):
        value = median(ours, key)
        print(f"  {label:<18} {value:6.1f} s vs floor {floor:5.1f} s = {value / floor:.2f}")
    print(f"  failover path: {sorted({sample['path'] for sample in ours})}")


if __name__ == "__main__":
    main()
