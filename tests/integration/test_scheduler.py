"""The scheduler layer over SSH against the dev cluster's real Slurm."""

from __future__ import annotations

import time
import uuid

import pytest

from dagster_slurm import SlurmQueueConfig, SlurmResource
from dagster_slurm.errors import ConfigurationError, SchedulerError
from dagster_slurm.scheduler.client import SlurmScheduler
from dagster_slurm.scheduler.watcher import JobWatcher
from dagster_slurm.slurm import JobState, SbatchSpec

pytestmark = pytest.mark.integration


@pytest.fixture
def slurm(slurm_cluster) -> SlurmResource:
    return SlurmResource.from_env(environ=slurm_cluster.env())


@pytest.fixture
def job_dir(slurm) -> str:
    return f"{slurm.base_path()}/test-jobs/{uuid.uuid4().hex[:12]}"


def submit(slurm, job_dir, name, body, **spec):
    script = f"{job_dir}/{name}.sh"
    spec.setdefault("time_limit", "00:05:00")
    spec.setdefault("output", f"{job_dir}/{name}.out")
    return slurm.scheduler().submit(
        SbatchSpec(job_name=name, script_path=script, **spec),
        state_path=f"{job_dir}/{name}.json",
        files={script: ("#!/bin/bash\n" + body + "\n", 0o755)},
    )


def wait_for(slurm, name, job_id, predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obs = slurm.scheduler().status([name], [job_id]).job(job_id)
        if predicate(obs):
            return obs
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never reached the expected state; last {obs}")


def read(slurm, path):
    from dagster_slurm.agent import exec_op

    return slurm.agent().run(exec_op(["cat", path])).stdout


def wait_for_first_line(slurm, path, timeout=60):
    """The first complete line of ``path`` on the cluster, once it has one."""
    from dagster_slurm.agent import exec_op

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = slurm.agent().run(exec_op(["head", "-n", "1", path]))
        if result.rc == 0 and result.stdout.endswith("\n"):
            return result.stdout.rstrip("\n")
        time.sleep(0.2)
    raise AssertionError(f"{path} had no complete line within {timeout} s")


@pytest.mark.release_subset
def test_submit_runs_as_submitter_and_squeue_parses_a_two_node_job(slurm, job_dir, slurm_cluster):
    name = f"t2n-{uuid.uuid4().hex[:6]}"
    job = submit(
        slurm, job_dir, name,
        "id -un; srun -l hostname; sleep 30",
        partition="cpu", num_nodes=2, ntasks_per_node=1, cpus_per_task=1,
    )
    try:
        obs = wait_for(slurm, name, job.job_id, lambda o: o.state is JobState.RUNNING)
        rec = obs.queue
        assert rec is not None and rec.name == name and rec.partition == "cpu"
        assert rec.num_nodes == 2 and rec.nodes is not None and set(rec.nodes) == {"c1", "c2"}
        assert rec.comment == job.token, "the submission token must travel in the comment"
        assert rec.time_limit_seconds == 300 and rec.time_left_seconds is not None
        assert rec.start_time is not None and rec.end_time is not None
        # RUNNING in squeue does not mean the script has printed yet: cancel once it has
        first = wait_for_first_line(slurm, f"{job_dir}/{name}.out")
        slurm.scheduler().cancel([job.job_id])
        final = wait_for(slurm, name, job.job_id, lambda o: o.terminal)
        assert final.state is JobState.CANCELLED
        out = read(slurm, f"{job_dir}/{name}.out").splitlines()
        assert first == out[0] == slurm_cluster.user
    finally:
        slurm.scheduler().cancel(job_name=name)


@pytest.mark.release_subset
def test_sacct_final_state_and_metrics_after_the_job_left_squeue(slurm, job_dir):
    name = f"tacct-{uuid.uuid4().hex[:6]}"
    body = "python3 -c 'b = bytearray(200 * 1024 * 1024); import time; time.sleep(3)'; exit 3"
    job = submit(slurm, job_dir, name, body, partition="cpu")
    watcher = JobWatcher(slurm.scheduler())
    watcher.track(job.job_id, name)
    final = watcher.wait(job.job_id, timeout=120)
    assert final.state is JobState.FAILED
    # Purge from squeue is MinJobAge later; ask accounting directly, as the watcher does then.
    record = slurm.scheduler().accounting([job.job_id])[job.job_id]
    assert record.state is JobState.FAILED and record.exit_code == 3
    assert record.elapsed_seconds is not None and record.elapsed_seconds >= 3
    assert record.max_rss_bytes is not None and record.max_rss_bytes > 150 * 1024 * 1024
    assert record.total_cpu_seconds is not None and record.alloc_cpus is not None


def test_finished_job_detected_from_status_file_when_accounting_is_off(slurm, job_dir):
    name = f"tnoacct-{uuid.uuid4().hex[:6]}"
    status = f"{job_dir}/{name}.status"
    job = submit(slurm, job_dir, name, f"echo 7 > {status}; exit 7", partition="cpu")
    watcher = JobWatcher(slurm.scheduler(), accounting=False)
    watcher.track(job.job_id, name, status_file=status)
    final = watcher.wait(job.job_id, timeout=60)
    assert final.terminal and final.exit_code == 7


@pytest.mark.release_subset
def test_cancelled_job_with_status_file_zero_is_cancelled_after_it_left_squeue(slurm, job_dir):
    """The status file says 0 (as after a drain), Slurm says CANCELLED: Slurm wins, also once
    squeue no longer lists the job."""
    name = f"tcxl-{uuid.uuid4().hex[:6]}"
    status = f"{job_dir}/{name}.status"
    job = submit(slurm, job_dir, name, f"echo 0 > {status}; echo wrote; sleep 300", partition="cpu")
    try:
        wait_for_first_line(slurm, f"{job_dir}/{name}.out")
        slurm.scheduler().cancel([job.job_id])
        assert wait_for(slurm, name, job.job_id, lambda o: o.terminal).state is JobState.CANCELLED
        # Tracked under a name squeue does not list: the view after Slurm purged the job
        # (MinJobAge), when only accounting and the status file are left. (A scheduler
        # without the user's shared answer: that one lists every job of the user, by id.)
        watcher = JobWatcher(SlurmScheduler(slurm.agent()))
        watcher.track(job.job_id, f"{name}-purged", status_file=status)
        final = watcher.wait(job.job_id, timeout=60)
        assert final.exit_code == 0, "the status file is read"
        assert final.state is JobState.CANCELLED and final.source == "sacct"
    finally:
        slurm.scheduler().cancel(job_name=name)


@pytest.mark.release_subset
def test_test_only_for_a_runnable_and_an_unrunnable_candidate(slurm, job_dir):
    scheduler = slurm.scheduler()
    ok = scheduler.test_only(SbatchSpec(job_name="probe", script_path="/bin/true", partition="gpu",
                                        gres="gpu:2", time_limit="00:10:00"))
    assert ok.runnable is True and ok.partition == "gpu" and ok.start_time is not None
    bad = scheduler.test_only(SbatchSpec(job_name="probe", script_path="/bin/true", partition="gpu",
                                         gres="gpu:3", time_limit="00:10:00"))
    assert bad.runnable is False and "not available" in (bad.error or "")


def test_gpu_job_sees_its_two_gpus(slurm, job_dir):
    name = f"tgpu-{uuid.uuid4().hex[:6]}"
    job = submit(slurm, job_dir, name, 'echo "$CUDA_VISIBLE_DEVICES"', partition="gpu", gpus_per_node=2)
    watcher = JobWatcher(slurm.scheduler())
    watcher.track(job.job_id, name)
    assert watcher.wait(job.job_id, timeout=60).state is JobState.COMPLETED
    assert read(slurm, f"{job_dir}/{name}.out").strip() == "0,1"


def test_sbatch_rejection_carries_slurms_message(slurm, job_dir):
    with pytest.raises(SchedulerError, match="(?i)invalid partition"):
        submit(slurm, job_dir, "treject", "true", partition="nosuchpartition")


@pytest.mark.parametrize(
    "spec",
    [
        {"partition": "gpu; touch /tmp/pwned"},
        {"job_name": "bad'name\""},
        {"extra_directives": ("--wrap=touch /tmp/pwned",)},
        {"extra_directives": ("--time=10",)},
    ],
)
def test_bad_input_is_rejected_before_anything_is_sent(slurm, job_dir, spec):
    transport = slurm.ssh.get_transport()
    slurm.base_path()  # resolve once, outside the measurement
    before = transport.stats.round_trips
    args = {"job_name": "tbad", "script_path": f"{job_dir}/x.sh", **spec}
    with pytest.raises(ConfigurationError):
        slurm.scheduler().submit(SbatchSpec(**args), state_path=f"{job_dir}/x.json")
    assert transport.stats.round_trips == before


def test_hostile_output_path_reaches_slurm_literally(slurm, job_dir):
    marker = f"dslurm-pwned-{uuid.uuid4().hex}"
    name = f"tlit-{uuid.uuid4().hex[:6]}"
    out = f"{job_dir}/o $(touch {marker}) `touch {marker}`;x.out"
    job = submit(slurm, job_dir, name, "echo hi", partition="cpu", output=out)
    watcher = JobWatcher(slurm.scheduler())
    watcher.track(job.job_id, name)
    assert watcher.wait(job.job_id, timeout=60).state is JobState.COMPLETED
    assert read(slurm, out).strip() == "hi"
    from dagster_slurm.agent import exec_op

    found = slurm.agent().run(exec_op(["find", "/home", "/tmp", "-name", marker]))
    assert found.stdout == "", "a shell metacharacter in a value was executed"


def test_queue_config_rejects_injection():
    with pytest.raises(Exception, match="partition"):
        SlurmQueueConfig(partition="gpu; touch pwned")
