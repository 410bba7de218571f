"""A node dies under a step, or the controller restarts, on the dev cluster (real daemons).

The slurmd of the node running the payload is SIGKILLed mid-payload. With the dev cluster's
``SlurmdTimeout=30`` the controller marks the node down and the job (or run allocation)
NODE_FAIL about 50 s later. The run must then end with an error naming the node failure and
the node, leave nothing in squeue, materialize nothing, and never start the payload a second
time (jobs and run allocations are submitted with ``--no-requeue``). A controller killed and
restarted mid-payload must not start the payload again either: killed right after the job
started, it may not have saved that start and then starts the job a second time with the
same id, which the job script's start marker refuses.

Each payload appends one line per start (node, restart count) to a file of its own, so a
second start would show. The killed slurmd is started again afterwards, and the test waits
for its node to be idle before the next test.
"""

import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from compute_support import compute, slurm_resource, squeue_names, step_failure, wait_until

from dagster_slurm import ComputeResource, SlurmRunAllocationConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Appends "<node> <restart count>" to STARTS_FILE, then waits until RELEASE_FILE appears
#: (at most 10 minutes) and reports a materialization.
PAYLOAD = """
import os, time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    starts, release = os.environ["STARTS_FILE"], os.environ["RELEASE_FILE"]
    with open(starts, "a") as out:
        out.write(f"{os.environ.get('SLURMD_NODENAME')} {os.environ.get('SLURM_RESTART_COUNT', '0')}\\n")
    pipes.log.info("payload started")
    deadline = time.monotonic() + 600
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.2)
    pipes.report_asset_materialization(metadata={"done": 1})
"""

#: Seconds from the kill to the end of the run that the issue sets as the bound.
RUN_END_BOUND = 120.0


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@pytest.fixture
def shared(slurm_cluster) -> Path:
    """A directory every node sees and the cluster user can write (the payload's start log
    and release file): the nodes have a /tmp of their own, the state directory is shared."""
    directory = Path(tempfile.mkdtemp(prefix="nodefail-", dir=slurm_cluster.state_dir))
    directory.chmod(0o777)
    payload = directory / "payload.py"
    payload.write_text(PAYLOAD)
    payload.chmod(0o644)
    return directory


def _slurm(env, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False,
                          env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"})


def _daemon_pid(slurm_cluster, name: str) -> int:
    return int((Path(slurm_cluster.state_dir) / "run" / f"{name}.pid").read_text().split()[0])


def _restore(slurm_cluster, env, node: str | None) -> None:
    """Start what was killed again and wait until the controller answers and ``node`` (when
    given) is idle, so that later tests find the whole cluster."""
    from dagster_slurm.devcluster import DevCluster

    DevCluster(state_dir=slurm_cluster.state_dir).up()
    wait_until(lambda: _slurm(env, "scontrol", "ping").returncode == 0, 90, "slurmctld to answer")
    if node is not None:
        wait_until(lambda: _slurm(env, "sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()
                   == "idle", 120, f"node {node} to be idle again")


def _materialize_in_thread(shared: Path, resource: ComputeResource, instance):
    outcome: dict = {}

    @dg.asset(name="node_failure_asset")
    def node_failure_asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(
            context=context, payload_path=str(shared / "payload.py"),
            extra_env={"STARTS_FILE": str(shared / "starts"),
                       "RELEASE_FILE": str(shared / "release")},
        ).get_results()

    def target():
        outcome["result"] = dg.materialize([node_failure_asset], resources={"compute": resource},
                                           instance=instance, raise_on_error=False)
        outcome["ended"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _first_start(shared: Path, thread: threading.Thread, outcome: dict) -> str:
    """The node of the payload's first start, once it has started."""
    def started() -> str:
        assert thread.is_alive() or "result" not in outcome, step_failure(outcome["result"])
        return (shared / "starts").exists() and (shared / "starts").read_text()

    line = wait_until(started, 300, "the payload to start")
    return line.split()[0]


def _starts(shared: Path) -> list[str]:
    return (shared / "starts").read_text().splitlines()


def _run_scope(env) -> ComputeResource:
    return ComputeResource(
        mode="slurm", slurm=slurm_resource(env), allocation_scope="run",
        run_allocation=SlurmRunAllocationConfig(heartbeat_interval=2.0),
        env_packages=["dagster-pipes"],
    )


def _kill_the_node_under_the_step(slurm_cluster, env, shared: Path, resource: ComputeResource,
                                  prefix: str) -> None:
    instance = dg.DagsterInstance.ephemeral()
    thread, outcome = _materialize_in_thread(shared, resource, instance)
    node = _first_start(shared, thread, outcome)
    assert node in ("c1", "c2"), node
    try:
        os.kill(_daemon_pid(slurm_cluster, f"slurmd-{node}"), signal.SIGKILL)
        killed = time.monotonic()
        thread.join(RUN_END_BOUND)
        assert not thread.is_alive(), f"the run did not end within {RUN_END_BOUND} s of the kill"
        print(f"run ended {outcome['ended'] - killed:.1f} s after the kill of slurmd-{node}")
        result = outcome["result"]
        failure = step_failure(result)
        assert "NodeFailure" in failure and "NODE_FAIL" in failure, failure
        assert node in failure, failure
        assert not result.get_asset_materialization_events()
        assert not squeue_names(env, prefix)
        assert _starts(shared) == [f"{node} 0"]
    finally:
        (shared / "release").touch()
        _restore(slurm_cluster, env, node)
    # The orphaned payload on the node that came back is gone; it was started once.
    assert _starts(shared) == [f"{node} 0"]


def test_asset_scope_node_failure_fails_the_step_naming_the_node(slurm_cluster, env, shared):
    _kill_the_node_under_the_step(slurm_cluster, env, shared, compute(env), "dsl-")


def test_run_scope_node_failure_fails_the_step_and_frees_the_allocation(slurm_cluster, env,
                                                                          shared):
    _kill_the_node_under_the_step(slurm_cluster, env, shared, _run_scope(env), "dsr-")


def test_a_restarted_controller_does_not_start_the_payload_again(slurm_cluster, env, shared):
    instance = dg.DagsterInstance.ephemeral()
    thread, outcome = _materialize_in_thread(shared, compute(env), instance)
    node = _first_start(shared, thread, outcome)
    try:
        os.kill(_daemon_pid(slurm_cluster, "slurmctld"), signal.SIGKILL)
        wait_until(lambda: _slurm(env, "scontrol", "ping").returncode != 0, 30,
                   "slurmctld to stop answering")
    finally:
        _restore(slurm_cluster, env, None)
    (shared / "release").touch()
    thread.join(300)
    assert not thread.is_alive(), "the run did not end"
    result = outcome["result"]
    assert _starts(shared) == [f"{node} 0"], "the payload was started a second time"
    if result.success:
        # The controller had saved the job's start: the job ran on and completed.
        assert len(result.get_asset_materialization_events()) == 1
    else:
        # It had not: the restarted controller started the job again with the same id, and
        # either the job script refused to start the payload a second time, saying so, or
        # Slurm itself killed the second start ("Killing non-startable batch JobId=N: Job
        # credential revoked") and the job ended FAILED. Either way the payload ran once.
        failure = step_failure(result)
        refused = "SlurmJobRequeued" in failure and "second time" in failure
        killed = "state FAILED" in failure
        assert refused or killed, failure
        assert not result.get_asset_materialization_events()
    print("controller restart:", "completed" if result.success else "refused second start")


def test_with_requeue_asked_the_step_says_so_before_the_payload_starts_again(
        slurm_cluster, env, shared):
    from compute_support import logged

    instance = dg.DagsterInstance.ephemeral()
    resource = compute(env, slurm=slurm_resource(env, requeue=True))
    thread, outcome = _materialize_in_thread(shared, resource, instance)
    node = _first_start(shared, thread, outcome)
    try:
        os.kill(_daemon_pid(slurm_cluster, f"slurmd-{node}"), signal.SIGKILL)
        lines = wait_until(lambda: len(_starts(shared)) > 1 and _starts(shared), 400,
                           "the payload's second start")
        # Said before the payload started again: the step logged the requeue when it saw
        # the job back in the queue, naming the node it ran on.
        assert logged(instance, "Slurm requeued job"), lines
        assert logged(instance, f"it ran on {node} and is back in the queue")
        assert lines[1].split()[1] == "1", lines  # SLURM_RESTART_COUNT of the second start
    finally:
        (shared / "release").touch()
        _restore(slurm_cluster, env, node)
    thread.join(300)
    assert not thread.is_alive(), "the run did not end"
    result = outcome["result"]
    assert result.success, step_failure(result)
    assert len(result.get_asset_materialization_events()) == 1
