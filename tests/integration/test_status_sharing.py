"""Scheduler citizenship on the dev cluster: the user's shared squeue answer and the
exit-status shortcut (real Slurm, sshd, agent and Dagster)."""


import os
import threading
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import compute, slurm_resource

from dagster_slurm import ComputeResource, SlurmResource
from dagster_slurm.agent import exec_op, write_file_op
from dagster_slurm.compute import slurm_runner

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _shell_asset(payload: str, seen: dict):
    @dg.asset(name="citizen")
    def citizen(context: dg.AssetExecutionContext, compute: ComputeResource):
        scheduler = compute.slurm.scheduler()
        before = dict(scheduler.stats.by_command)
        yield from compute.run(context=context, payload_path=payload).get_results()
        seen["calls"] = {k: v - before.get(k, 0) for k, v in scheduler.stats.by_command.items()
                         if v - before.get(k, 0)}

    return citizen


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_job_that_ends_before_the_first_poll_costs_one_sbatch_one_squeue_one_sacct(
    env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the first poll far away: the job ends before it, so only its status file (read with
    # the Pipes tail, no scheduler call) can make the step poll
    monkeypatch.setattr(slurm_runner, "FIRST_POLL", 120.0)
    payload = tmp_path / "trivial.sh"
    payload.write_text("#!/bin/bash\necho trivial\n")
    seen: dict = {}
    resource = compute(env)  # the environment the other tests deploy: none packed here
    result = dg.materialize([_shell_asset(str(payload), seen)], resources={"compute": resource})
    assert result.success
    calls = seen["calls"]
    assert calls.get("sbatch") == 1 and calls.get("sacct", 0) <= 1
    # one squeue; a second only when the first saw the job still COMPLETING
    assert calls.get("squeue", 0) in (1, 2), calls


def test_a_status_file_written_while_the_job_still_runs_does_not_end_the_step(
    env, tmp_path: Path
) -> None:
    """The payload writes "0" to its own exit-status file early (as if the payload ended
    while the batch script went on with its epilogue), then waits for a go-ahead: the step
    must not end, nor report a materialization, until the scheduler says the job ended."""
    slurm = slurm_resource(env)
    marks = f"{slurm.base_path()}/test-marks/status-{uuid.uuid4().hex[:8]}"
    slurm.agent().run(write_file_op(f"{marks}/.keep", "", makedirs=True))
    payload = tmp_path / "epilogue.sh"
    payload.write_text(
        "#!/bin/bash\n"
        "echo 0 > exit_status\n"  # the job runs in its job directory, next to the file
        f"touch {marks}/early\n"
        f"while [ ! -e {marks}/go ]; do sleep 0.1; done\n"
        f"touch {marks}/finished\n"
    )
    seen: dict = {}
    resource = compute(env, slurm=slurm)
    outcome: dict = {}
    run = threading.Thread(target=lambda: outcome.update(result=dg.materialize(
        [_shell_asset(str(payload), seen)], resources={"compute": resource})))
    scheduler = slurm.scheduler()
    try:
        run.start()
        _wait_until(lambda: os.path.exists(f"{marks}/early"), 120, "the early status file")
        polled = scheduler.stats.by_command.get("squeue", 0)
        # the shortcut makes the step ask the scheduler at once (and again at its back-off)
        _wait_until(lambda: scheduler.stats.by_command.get("squeue", 0) >= polled + 2, 60,
                    "two status polls after the early status file")
        assert run.is_alive(), "the step ended while the scheduler still ran the job"
        assert not os.path.exists(f"{marks}/finished")
    finally:
        slurm.agent().run(write_file_op(f"{marks}/go", ""))
        run.join(120)
    assert not run.is_alive()
    assert outcome["result"].success
    assert os.path.exists(f"{marks}/finished"), "the step ended before the payload did"
    slurm.agent().run(exec_op(["rm", "-rf", marks]))


def test_processes_of_one_user_share_one_squeue_answer(env) -> None:
    """Two agent processes (two resources of one user): the second poll, within
    status_max_age, is served the first one's answer; a poll that needs a newer answer (a
    job the shared answer does not list yet) gets one (from the process that refreshed
    last, so without waiting for the floor another process's refresh sets)."""
    first = slurm_resource(env)
    second = SlurmResource(ssh=first.ssh, queue=first.queue, python="/usr/bin/python3",
                           status_max_age=30.0)
    first = SlurmResource(ssh=first.ssh, queue=first.queue, status_max_age=30.0)
    job_dir = f"{first.base_path()}/test-jobs/{uuid.uuid4().hex[:12]}"
    from dagster_slurm.slurm import SbatchSpec

    def submit(name: str) -> str:
        script = f"{job_dir}/{name}.sh"
        return first.scheduler().submit(
            SbatchSpec(job_name=name, script_path=script, time_limit="00:05:00",
                       partition="cpu", output=f"{job_dir}/{name}.out"),
            state_path=f"{job_dir}/{name}.json",
            files={script: ("#!/bin/bash\nsleep 60\n", 0o755)},
        ).job_id

    names = [f"dsl-share-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    try:
        job_a = submit(names[0])
        a = first.scheduler()
        b = second.scheduler()
        assert a.agent is not b.agent
        shot = a.status([names[0]], [job_a], shared=True)
        assert shot.job(job_a).state is not None
        ran_before = b.stats.by_command.get("squeue", 0)
        served = b.status([names[0]], [job_a], shared=True)
        assert served.job(job_a).state is not None
        assert b.stats.by_command.get("squeue", 0) == ran_before, "the second poll ran squeue"
        assert b.stats.by_command.get("squeue_shared") == 1
        job_b = submit(names[1])  # not in the shared answer: that poll needs a newer one
        ran_a = a.stats.by_command.get("squeue", 0)
        newer = a.status([names[1]], [job_b], shared=True)  # a refreshed last: no floor
        assert newer.job(job_b).state is not None
        assert a.stats.by_command.get("squeue", 0) == ran_a + 1
    finally:
        first.scheduler().cancel(job_name=names[0])
        first.scheduler().cancel(job_name=names[1])
        first.agent().run(exec_op(["rm", "-rf", job_dir]))
        second.scheduler().agent.close()  # its agent process; the SSH connection is shared
