"""Hand-over gap of a relay: from the predecessor's drain to the successor's first payload.

One Dagster run with a run-scoped Ray allocation (RayLauncher) on the dev cluster. Its
asset runs a payload step that works in units of 0.5 s and finishes its unit on the drain
signal, queues a successor, requests the drain, promotes the successor and starts the next
payload step there. Two cases:

* (a) ``running``: the successor is already RUNNING when the drain is requested (the
  allocations take one node each, the partition has two);
* (b) ``pending``: the successor is PENDING at drain time (each allocation takes both nodes
  of the partition) and starts only once the predecessor has gone: ``promote_successor(
  wait=...)`` releases the drained predecessor and promotes the successor once it runs.

Printed per case: the gap (seconds from the drain request to the first command of the next
payload step, read on the node's clock, which is this machine's on the dev cluster), its
parts ``drained`` (the drained payload step returned) and ``running`` (the successor seen
RUNNING, the promotion starts; in case (b) from the library's log line), and the floor: the promotion, which starts the successor's own Ray cluster and waits until it
accepts steps (Ray's start is nearly all of it), measured in the same run. The ratio
gap/floor says how much the relay adds (the drain, the hand-over of the nodes in case (b),
the first step's launch) to what Ray itself takes.

Needs the dev cluster (``eval "$(dagster-slurm dev-cluster env)"``) and a cluster-side
environment with ray: ``--env-path`` (pre-deployed) or packed from ``dagster-pipes`` +
``ray[default,data]==2.60.0`` (cached on the cluster).
"""

import argparse
import os
import statistics
import time

import dagster as dg

from dagster_slurm import (
    ComputeResource,
    RayLauncher,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
)
from dagster_slurm.slurm.states import JobState

RAY_PACKAGES = ["dagster-pipes", "ray[default,data]==2.60.0"]

UNITS = """
drained=""
trap 'drained=1' TERM
for unit in $(seq 1 600); do
    sleep 0.5 & wait $! || wait $!
    [ -z "$drained" ] || exit 0
done
exit 3
"""


def _compute(nodes: int, env_path: str | None) -> ComputeResource:
    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION", "cpu"),
                             time_limit="00:15:00", cpus=2, mem="2500M")
    return ComputeResource(
        mode="slurm", slurm=SlurmResource.from_env(queue=queue),
        default_launcher=RayLauncher(include_dashboard=False), allocation_scope="run",
        run_allocation=SlurmRunAllocationConfig(num_nodes=nodes, heartbeat_interval=5),
        pre_deployed_env_path=env_path, env_packages=None if env_path else RAY_PACKAGES,
    )


def _wait_for(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class _Timeline:
    """A logger for ``promote_successor``: passes each message on and keeps when it came."""

    def __init__(self, log) -> None:  # noqa: ANN001 - Dagster's step log
        self.log = log
        self.said: list[tuple[float, str]] = []

    def info(self, message: str, *args) -> None:  # noqa: ANN002
        self.said.append((time.time(), message))
        self.log.info(message, *args)

    warning = error = debug = info

    def at(self, words: str) -> float:
        """When the first message with ``words`` came."""
        return next(when for when, message in self.said if words in message)


def measure(case: str, env_path: str | None) -> dict[str, float]:
    """Seconds of one relay: ``gap`` and ``floor`` (the promotion: the successor's Ray start)."""
    figures: dict[str, float] = {}

    @dg.asset(name=f"relay_{case}")
    def relay(context: dg.AssetExecutionContext, compute: ComputeResource):
        import threading

        session = compute.get_run_allocation_session(context)
        first = session.allocation
        drained: dict = {}
        worker = threading.Thread(target=lambda: drained.setdefault(
            "result", session.execute_in_session(["bash", "-c", UNITS], name="units")))
        worker.start()
        successor = session.submit_successor()
        if case == "running":
            _wait_for(lambda: successor.state() is JobState.RUNNING, 180, "the successor")
        else:
            _wait_for(lambda: successor.state() is JobState.PENDING, 60, "the queued successor")
        time.sleep(1.0)  # the payload is inside its units
        start = time.time()
        first.request_drain()
        worker.join(120)
        result = drained["result"]
        assert result.drained and result.exit_code == 0, result
        figures["drained"] = time.time() - start
        if case == "pending":
            # the library's way: the wait releases the drained predecessor (its nodes are
            # the ones the successor waits for) and promotes the successor once it runs
            timeline = _Timeline(context.log)
            promoted = session.promote_successor(wait=180, logger=timeline)
            promoting = timeline.at("runs; promoting it")
        else:
            promoting = time.time()
            promoted = session.promote_successor()
        figures["running"] = promoting - start
        promoted_at = time.time()
        step = session.execute_in_session(["date", "+%s.%N"], name="next")
        figures["gap"] = float(step.stdout_tail.strip()) - start
        figures["floor"] = promoted_at - promoting
        assert promoted.job_id == successor.job_id
        context.log.info(f"relay {case}: {figures}")
        return dg.MaterializeResult(metadata={k: round(v, 3) for k, v in figures.items()})

    nodes = 1 if case == "running" else 2
    result = dg.materialize([relay], resources={"compute": _compute(nodes, env_path)})
    assert result.success
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="running,pending")
    parser.add_argument("--env-path", default=os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"))
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (medians)")
    args = parser.parse_args()
    print(f"{'case':>8} {'gap':>7} {'floor (promotion, Ray start)':>29} {'gap/floor':>10}"
          f" {'drained':>8} {'running':>8}")
    for case in args.cases.split(","):
        runs = [measure(case, args.env_path) for _ in range(args.repeat)]
        for f in runs:
            _row(case, f)
        if len(runs) > 1:
            medians = {key: statistics.median(f[key] for f in runs) for key in runs[0]}
            gaps = [f["gap"] for f in runs]
            _row(f"median {case}", medians, f" (gap {min(gaps):.1f}-{max(gaps):.1f})")


def _row(case: str, f: dict[str, float], note: str = "") -> None:
    print(f"{case:>8} {f['gap']:>6.1f}s {f['floor']:>28.1f}s {f['gap'] / f['floor']:>10.2f}"
          f" {f['drained']:>7.1f}s {f['running']:>7.1f}s{note}", flush=True)


if __name__ == "__main__":
    main()
