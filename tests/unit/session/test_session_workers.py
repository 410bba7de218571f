"""Adding a worker allocation and waiting for it (in-memory cluster), and its sbatch request.

The batch script itself runs in ``test_session_worker_script.py`` (bash with stub commands).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from session_fakes import FakeCluster, on_fake_cluster

from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.session import RunSession
from dagster_slurm.session.workers.job_script import worker_start_args, worker_submission
from dagster_slurm.session.workers.submit import (
    JOIN_POLL_INTERVAL,
    WorkerAllocation,
    joined_ids,
    parse_ray_nodes,
)
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.slurm.states import JobState

RUN_ID = "7d1f0c2e-2222-4a6e-8f0e-1b2c3d4e5f61"
GPU = SlurmWorkerAllocationConfig(partition="gpu", num_nodes=2, gpus_per_node=4,
                                  ray_resources={"accelerator:a40": 1})


def _session(launcher: Any = None) -> tuple[RunSession, FakeCluster]:
    slurm = SlurmResource(ssh=SSHConnectionResource(host="login.invalid", user="u"),
                          remote_base="/cluster/ds",
                          queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G"))
    config = SlurmRunAllocationConfig(time_limit="01:00:00", cpus_per_task=4,
                                      signal_before_timeout="TERM@300")
    return on_fake_cluster(slurm, RUN_ID, config, launcher or RayLauncher(),
                           activation="/env/activate.sh")


def _running_head(session: RunSession, cluster: FakeCluster) -> str:
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 1, lambda: cluster.start(job.job_id, ray_address="10.0.0.1:6379"))
    head = session.ensure().job_id
    cluster.on_submit = None
    return head


# -- the sbatch request and the script's words ---------------------------------------------------
def test_the_submission_is_the_resolved_request_with_the_session_name_and_log():
    paths = SessionPaths.create("/cluster/ds", RUN_ID)
    config = SlurmWorkerAllocationConfig(
        partition="gpu", num_nodes=2, cpus_per_task=8, gpus_per_node=4, mem="64G",
        time_limit="08:00:00", signal_before_timeout="TERM@600", nodelist="g[1-2]")
    spec, files = worker_submission(paths=paths, job_name="dsr-x", launcher=RayLauncher(),
                                    config=config, activation=None, token="tok")
    assert (spec.job_name, spec.partition, spec.num_nodes, spec.gpus_per_node) == (
        "dsr-x", "gpu", 2, 4)
    assert spec.signal == "B:TERM@600" and spec.nodelist == "g[1-2]" and spec.mem == "64G"
    assert spec.output == spec.error == paths.output and spec.chdir == paths.session_dir
    assert list(files) == [spec.script_path] and spec.script_path.startswith(paths.submit_dir("tok"))
    assert files[spec.script_path][1] == 0o600


def test_the_allocations_options_come_after_the_launchers_and_win():
    launcher = RayLauncher(ray_start_args=["--log-style=record"])
    config = SlurmWorkerAllocationConfig(ray_resources={"vram_48gb": 2, "accelerator:a40": 1},
                                         ray_start_args=["--num-cpus=8", "--temp-dir=/scratch/r"])
    assert worker_start_args(launcher, config) == [
        "--log-style=record",
        '--resources={"accelerator:a40": 1.0, "dagster_slurm_worker": 1, "vram_48gb": 2.0}',
        "--num-cpus=8", "--temp-dir=/scratch/r"]


def test_hostile_values_stay_data_in_the_script(tmp_path):
    paths = SessionPaths(str(tmp_path), f"{tmp_path}/s p'a\"ce $(touch {tmp_path}/pwned)")
    launcher = RayLauncher(redis_password="p'w\"$(touch x)`id`", pre_start_commands=["true"])
    config = SlurmWorkerAllocationConfig(partition="gpu", num_nodes=1, cpus_per_task=1,
                                         gpus_per_node=0, time_limit="00:10:00")
    _spec, files = worker_submission(paths=paths, job_name="dsr-x", launcher=launcher,
                                     config=config, activation=f"{tmp_path}/a b'c.sh",
                                     token="tok")
    ((text, _mode),) = files.values()
    script = tmp_path / "worker.sh"
    script.write_text(text)
    assert subprocess.run(["/bin/bash", "-n", str(script)]).returncode == 0
    # run the prologue and the assignments: every value reads back as given
    Path(paths.submit_dir("tok")).mkdir(parents=True)
    (tmp_path / "a b'c.sh").write_text("")
    head = text.split("__dw_job=${SLURM_JOB_ID")[0].split("set -u", 1)[1]
    probe = subprocess.run(
        ["/bin/bash", "-c", head + '\nprintf "%s\\n" "$__dw_session_dir" "$__dw_redis_password"'
         ' "$__ds_activation" "$__ds_ray_num_gpus"'],
        capture_output=True, text=True, cwd=tmp_path)
    assert probe.stdout.splitlines() == [paths.session_dir, launcher.redis_password,
                                         f"{tmp_path}/a b'c.sh", "0"], probe.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "x").exists()


# -- ray_nodes -----------------------------------------------------------------------------------
def test_every_node_must_have_joined_the_same_head():
    joined = parse_ray_nodes("g1 aa 7\ng2 bb 7\nbroken line\n")
    assert joined == {"g1": ("aa", "7"), "g2": ("bb", "7")}
    assert joined_ids(["g1", "g2"], joined) == ["aa", "bb"]
    assert joined_ids(["g1", "g2", "g3"], joined) is None
    assert joined_ids([], joined) is None
    assert joined_ids(["g1", "g2"], parse_ray_nodes("g1 aa 7\ng2 bb 8\n")) is None


# -- adding --------------------------------------------------------------------------------------
def test_adding_requires_a_ray_session():
    session, _cluster = _session(BashLauncher())
    with pytest.raises(SessionError, match="RayLauncher"):
        session.add_worker_allocation(GPU)


def test_adding_returns_at_submission_and_records_the_worker():
    session, cluster = _session()
    head = _running_head(session, cluster)
    worker = session.add_worker_allocation(GPU)
    assert isinstance(worker, WorkerAllocation) and worker.job_id != head
    assert cluster.jobs[worker.job_id].state is JobState.PENDING and worker.state() is JobState.PENDING
    spec = cluster.specs[-1]
    assert spec.job_name == session.job_name and spec.partition == "gpu" and spec.num_nodes == 2
    # unset fields inherit the head allocation's request
    assert spec.time_limit == "01:00:00" and spec.cpus_per_task == 4 and spec.mem == "8G"
    assert worker.config.signal_before_timeout == "TERM@300"
    doc = session.io.read().doc
    assert doc.worker_submissions[worker.token].status == "submitted"
    record = doc.workers[worker.job_id]
    assert record.config["partition"] == "gpu" and not record.released and not record.ray_node_ids
    # a second allocation inherits the first worker's fields, not its per-submission ones
    second = session.add_worker_allocation(SlurmWorkerAllocationConfig(num_nodes=1))
    assert second.config.partition == "gpu" and second.config.gpus_per_node == 4
    assert second.config.ray_resources == {}


def test_adding_to_a_closed_session_is_refused():
    session, cluster = _session()
    _running_head(session, cluster)
    session.close(cancel=True)
    fresh, _ = _session()
    fresh.context.io = cluster
    with pytest.raises(SessionError):
        fresh.add_worker_allocation(GPU)


# -- waiting -------------------------------------------------------------------------------------
def _join_later(session: RunSession, cluster: FakeCluster, worker: WorkerAllocation,
                at: float, head: str = "100") -> None:
    paths = session.paths

    def join() -> None:
        cluster.start(worker.job_id, nodes=("g1", "g2"))
        cluster.files[paths.nodes(worker.job_id)] = "g1\ng2\n"
        cluster.files[paths.worker_state(worker.job_id)] = "joined\n"
        cluster.files[paths.ray_nodes(worker.job_id)] = f"g1 aa {head}\ng2 bb {head}\n"

    cluster.clock.at(at, join)


def test_waiting_starts_the_head_first_and_records_the_join():
    session, cluster = _session()
    worker = session.add_worker_allocation(GPU)  # before the session has a head
    cluster.on_submit = lambda job: cluster.clock.at(
        cluster.clock.t + 1, lambda: cluster.start(job.job_id, ray_address="10.0.0.1:6379"))
    _join_later(session, cluster, worker, at=30, head="101")
    assert session.wait_for_worker_allocation(worker, timeout=300) == ["aa", "bb"]
    current = session.current_allocation()
    assert current is not None and current.job_id == "101"
    record = session.io.read().doc.workers[worker.job_id]
    assert record.ray_node_ids == {"g1": "aa", "g2": "bb"} and record.nodes == ["g1", "g2"]
    assert 30 <= cluster.clock.t < 45  # polled with a backoff, not a busy loop
    assert cluster.calls["poll_files"] < 20


def test_a_running_allocations_join_is_seen_at_once_without_more_squeue():
    """Once the job runs, its nodes' announcement is read every JOIN_POLL_INTERVAL seconds,
    while squeue keeps the backoff's pace."""
    session, cluster = _session()
    head = _running_head(session, cluster)
    worker = session.add_worker_allocation(GPU)
    paths = session.paths
    start = cluster.clock.t
    cluster.clock.at(start + 3, lambda: cluster.start(worker.job_id, nodes=("g1", "g2")))

    def join() -> None:
        cluster.files[paths.nodes(worker.job_id)] = "g1\ng2\n"
        cluster.files[paths.ray_nodes(worker.job_id)] = f"g1 aa {head}\ng2 bb {head}\n"

    cluster.clock.at(start + 20.05, join)
    cluster.calls.clear()
    assert session.wait_for_worker_allocation(worker, timeout=300) == ["aa", "bb"]
    assert cluster.clock.t <= start + 20.05 + JOIN_POLL_INTERVAL + 1e-6
    # squeue at the backoff's pace alone, as before: at 0, 1, 2.5, 4.75 (runs: the backoff
    # starts again), 5.75, 7.25, 9.5, 12.9 and 18 s, not once per file read
    assert cluster.calls["poll_files_with_squeue"] <= 9
    assert cluster.calls["poll_files"] > 50


def test_waiting_times_out_naming_the_job():
    session, cluster = _session()
    _running_head(session, cluster)
    worker = session.add_worker_allocation(GPU)
    with pytest.raises(TimeoutError, match=worker.job_id):
        session.wait_for_worker_allocation(worker, timeout=20)
    assert 20 <= cluster.clock.t < 30


def test_waiting_fails_when_the_job_ends_or_releases_itself():
    session, cluster = _session()
    _running_head(session, cluster)
    worker = session.add_worker_allocation(GPU)
    cluster.clock.at(cluster.clock.t + 5, lambda: cluster.end(worker.job_id, JobState.FAILED))
    with pytest.raises(SessionError, match=f"{worker.job_id} ended \\(FAILED\\)"):
        session.wait_for_worker_allocation(worker, timeout=60)
    other = session.add_worker_allocation(GPU)
    cluster.start(other.job_id, nodes=("g1",))
    cluster.files[session.paths.worker_state(other.job_id)] = "released no_head\n"
    with pytest.raises(SessionError, match="released no_head"):
        session.wait_for_worker_allocation(other, timeout=60)
