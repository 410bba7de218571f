"""Per-user submission limits on the dev cluster (MaxSubmitJobs of dslurm's association).

Slurm refuses a sbatch beyond the limit (``sbatch: error: AssocMaxSubmitJobLimit``). A step
whose submission is refused waits for a free slot, saying so, and submits when one of the
user's jobs has ended; its run ending stops the wait with nothing submitted; and
``SlurmResource.submit_limit_timeout`` turns a long wait into an error naming the limit.
Each test sets the limit with sacctmgr and resets it afterwards.
"""

import importlib
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
import pytest
from compute_support import (
    compute,
    logged,
    materialize_one,
    run_logs,
    slurm_resource,
    squeue_names,
    step_failure,
    wait_until,
    write_payload,
)
from session_support import session_compute

from dagster_slurm import ComputeResource, SlurmResource
from dagster_slurm.agent.ops import exec_op

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The library imports these on a step's first use. They are imported here, in the main
# thread, before the runs start in threads: pytest rewrites the package's modules as they
# are imported (the package provides a pytest plugin), and CPython 3.11 before 3.11.8 can
# fail to parse in two threads at once ("SystemError: AST constructor recursion depth
# mismatch"), which once failed a run of this module.
for _module in ("dagster_slurm.compute.slurm_runner", "dagster_slurm.compute.cleanup",
                "dagster_slurm.compute.local_runner", "dagster_slurm.session.frontend.runner",
                "dagster_slurm.session.frontend.lifecycle", "dagster_slurm.session.head.layout",
                "dagster_slurm.session.head.run_tag", "dagster_slurm.session.core.config",
                "dagster_slurm.jobs.activation"):
    importlib.import_module(_module)

PAYLOAD = """
import time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    time.sleep(2)
    pipes.report_asset_materialization(metadata={"done": 1})
"""

WAITING = "waiting for one to end"


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _sacctmgr(env: dict[str, str], *args: str) -> None:
    subprocess.run(["sacctmgr", "-i", *args], check=True, capture_output=True, text=True,
                   env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"})


def _queued(env: dict[str, str], user: str) -> list[str]:
    """Ids of ``user``'s jobs that count against MaxSubmitJobs (not yet ended)."""
    out = subprocess.run(
        ["squeue", "-h", "-u", user, "-t", "PENDING,RUNNING,SUSPENDED,COMPLETING", "-o", "%i"],
        capture_output=True, text=True, check=True,
        env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}).stdout
    return out.split()


def _limit(env: dict[str, str], count: int):  # noqa: ANN202
    user = env["SLURM_EDGE_NODE_USER"]
    wait_until(lambda: not _queued(env, user), 120, f"no job of {user} queued before the test")
    _sacctmgr(env, "modify", "user", user, "set", f"MaxSubmitJobs={count}")
    return user


@pytest.fixture
def limit_three(env):
    user = _limit(env, 3)
    yield user
    _sacctmgr(env, "modify", "user", user, "set", "MaxSubmitJobs=-1")


@dataclass(frozen=True)
class Slot:
    """The user whose one slot a job holds, and how to end that job."""

    user: str
    free: Callable[[], object]


@pytest.fixture
def one_slot_taken(env):
    """MaxSubmitJobs=1 and the one slot held by a job submitted directly as the user."""
    user = _limit(env, 1)
    slurm = slurm_resource(env)
    blocker = slurm.agent().run(exec_op(
        ["sbatch", "--parsable", "--job-name=limits-blocker", "--time=5", "--mem=100M",
         "--partition=cpu", "--output=/dev/null", "--wrap", "sleep 300"], timeout=30))
    assert blocker.rc == 0, blocker.stderr
    job_id = blocker.stdout.strip().split(";")[0]
    yield Slot(user, lambda: slurm.agent().run(exec_op(["scancel", job_id], timeout=30)))
    slurm.agent().run(exec_op(["scancel", job_id], timeout=30))
    _sacctmgr(env, "modify", "user", user, "set", "MaxSubmitJobs=-1")


def test_runs_beyond_the_limit_wait_for_a_slot_and_all_succeed(env, tmp_path, limit_three):
    payload = write_payload(tmp_path, "short.py", PAYLOAD)
    resource = compute(env)
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], len(_queued(env, limit_three)))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results: dict[int, dg.ExecuteInProcessResult] = {}

    def run(index: int) -> None:
        results[index] = materialize_one(payload, resource, raise_on_error=False,
                                         name=f"limited_{index}")

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    stop.set()
    sampler.join(10)
    assert not any(t.is_alive() for t in threads), "a run did not finish"
    failures = {i: step_failure(r) for i, r in results.items() if not r.success}
    assert not failures, failures
    assert len(results) == 8
    assert 1 <= peak[0] <= 3, f"{peak[0]} jobs of {limit_three} were queued at once"
    said = [m for r in results.values() for m in run_logs(r) if m and WAITING in m]
    assert said, "no run said it waited for a slot"
    assert f"of 3 jobs allowed for user {limit_three} are queued" in said[0]
    assert "MaxSubmitJobs" in said[0]


def test_a_run_ended_while_waiting_for_a_slot_submits_nothing(env, tmp_path, one_slot_taken):
    payload = write_payload(tmp_path, "short.py", PAYLOAD)
    instance = dg.DagsterInstance.ephemeral()
    outcome = {}

    @dg.asset(name="held")
    def held(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    def target() -> None:
        outcome["result"] = dg.materialize(
            [held], resources={"compute": compute(env, run_status_interval=1.0)},
            instance=instance, raise_on_error=False)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_until(lambda: logged(instance, WAITING), 180, "the step to wait for a slot")
    (run,) = instance.get_runs()
    instance.report_run_failed(run, "the run was terminated (by the test)")
    thread.join(60)
    assert not thread.is_alive(), "the step did not stop waiting"
    assert "DagsterRunEnded" in step_failure(outcome["result"])
    assert not squeue_names(env, f"dsl-{run.run_id[:8]}")
    sacct = subprocess.run(
        ["sacct", "-n", "-X", "-u", one_slot_taken.user, "-S", "now-10minutes", "-o", "JobName%60"],
        capture_output=True, text=True, check=True,
        env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"}).stdout
    assert f"dsl-{run.run_id[:8]}" not in sacct


def test_submit_limit_timeout_gives_a_clear_error(env, tmp_path, one_slot_taken):
    payload = write_payload(tmp_path, "short.py", PAYLOAD)
    base = slurm_resource(env)
    slurm = SlurmResource(ssh=base.ssh, queue=base.queue, remote_base=base.remote_base,
                          submit_limit_timeout=5)
    result = materialize_one(payload, compute(env, slurm=slurm), raise_on_error=False)
    assert not result.success
    failure = step_failure(result)
    assert "submit_limit_timeout=5 s" in failure
    assert "MaxSubmitJobs" in failure and "AssocMaxSubmitJobLimit" in failure


def test_a_run_allocation_waits_for_a_slot_and_runs_once_one_frees(env, tmp_path, one_slot_taken):
    payload = write_payload(tmp_path, "short.py", PAYLOAD)
    instance = dg.DagsterInstance.ephemeral()
    outcome = {}

    def target() -> None:
        outcome["result"] = materialize_one(payload, session_compute("bash", env),
                                            raise_on_error=False, instance=instance)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_until(lambda: logged(instance, WAITING), 180, "the run allocation to wait for a slot")
    one_slot_taken.free()
    thread.join(300)
    assert not thread.is_alive(), "the run did not finish"
    result = outcome["result"]
    assert result.success, step_failure(result)
    assert any("a slot freed" in (m or "") for m in run_logs(result))
