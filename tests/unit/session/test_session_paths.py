"""Session file layout, job names, the configuration digest and the ready file."""

from __future__ import annotations

import re

import pytest

from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.allocation import parse_ready
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.paths import SessionPaths, session_job_name, session_name
from dagster_slurm.session.session import RunSession, session_digest
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.queue import SlurmQueueConfig

RUN_ID = "0f6c2d0e-5b7a-4a51-9d7e-2c1a3b4c5d6e"


# -- SessionPaths ------------------------------------------------------------------------------


def test_layout_under_the_session_directory() -> None:
    paths = SessionPaths.create("/scratch/ds/", RUN_ID, "abcd1234")
    session = f"/scratch/ds/sessions/{RUN_ID}-abcd1234"
    assert paths.base == "/scratch/ds"
    assert paths.sessions_root == "/scratch/ds/sessions"
    assert paths.session_dir == session
    assert paths.document == f"{session}/allocation.json"
    assert paths.lock == f"{session}/lock"
    assert paths.heartbeat == f"{session}/heartbeat"
    assert paths.output == f"{session}/allocation-%j.log"
    assert paths.output_of("77") == f"{session}/allocation-77.log"
    assert paths.submit_dir("tok") == f"{session}/submit/tok"
    assert paths.job_dir("77") == f"{session}/jobs/77"
    assert paths.ready("77") == f"{session}/jobs/77/ready"
    assert paths.nodes("77") == f"{session}/jobs/77/nodes"
    assert paths.drained("77") == f"{session}/jobs/77/drained"
    assert paths.steps_dir("77") == f"{session}/jobs/77/steps"
    assert paths.request("77", "r1") == f"{session}/jobs/77/requests/r1.request"
    assert paths.request("77", "r1", "cancel") == f"{session}/jobs/77/requests/r1.cancel"


def test_document_lock_and_heartbeat_do_not_depend_on_the_allocation() -> None:
    paths = SessionPaths.create("/b", "run")
    for job_id in ("1", "2"):
        assert job_id not in paths.document + paths.lock + paths.heartbeat


def test_without_digest_the_session_is_named_after_the_run() -> None:
    assert SessionPaths.create("/b", "run-1").session_dir == "/b/sessions/run-1"
    assert session_name("run-1") == "run-1"
    assert session_job_name("run-1") == "dsr-run-1"


def test_same_inputs_give_the_same_paths() -> None:
    assert SessionPaths.create("/b", RUN_ID, "d1") == SessionPaths.create("/b/", RUN_ID, "d1")
    assert SessionPaths.create("/b", RUN_ID, "d1") != SessionPaths.create("/b", RUN_ID, "d2")
    assert SessionPaths.create("/b", RUN_ID) != SessionPaths.create("/b", "other-run")


def test_invocation_paths_live_under_the_allocation_steps() -> None:
    paths = SessionPaths.create("/b", "run", "d1")
    inv = paths.invocation("77", "my_step", "inv1")
    assert inv.job_dir == "/b/sessions/run-d1/jobs/77/steps/my_step/inv1"
    assert inv.step_dir == "/b/sessions/run-d1/jobs/77/steps/my_step"
    assert inv.base == "/b"  # removals stay inside the base path
    assert inv.status == f"{inv.job_dir}/exit_status"
    assert inv.drain == f"{inv.job_dir}/drain_signal"
    assert inv.stdout == f"{inv.job_dir}/stdout.log"
    assert inv.stderr == f"{inv.job_dir}/stderr.log"


def test_each_invocation_gets_its_own_directory() -> None:
    paths = SessionPaths.create("/b", "run", "d1")
    first, second = paths.invocation("77", "s"), paths.invocation("77", "s")
    assert first.step_dir == second.step_dir
    assert first.job_dir != second.job_dir


def test_step_keys_are_made_safe_path_components() -> None:
    inv = SessionPaths.create("/b", "run").invocation("77", "op[a/b] x", "i")
    step = inv.step_dir.rsplit("/", 1)[1]
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", step)
    assert inv.job_dir == f"/b/sessions/run/jobs/77/steps/{step}/i"


# -- job names ---------------------------------------------------------------------------------


def test_job_name_is_dsr_run_digest() -> None:
    assert session_job_name(RUN_ID, "abcd1234") == f"dsr-{RUN_ID}-abcd1234"
    assert session_name(RUN_ID, "abcd1234") == f"{RUN_ID}-abcd1234"


@pytest.mark.parametrize("run_id", [RUN_ID, "a b;c$(id)", "x" * 200, "ünïcode/run"])
def test_job_name_is_a_valid_slurm_name_and_stable(run_id: str) -> None:
    name = session_job_name(run_id, "abcd1234")
    assert name == session_job_name(run_id, "abcd1234")
    assert re.fullmatch(r"dsr-[A-Za-z0-9_.-]+", name)
    SbatchSpec(job_name=name, script_path="s")  # accepted by the sbatch validation
    assert name.endswith("-abcd1234")


def test_different_digests_give_different_job_names() -> None:
    assert session_job_name(RUN_ID, "aaaa0000") != session_job_name(RUN_ID, "bbbb1111")


# -- digest ------------------------------------------------------------------------------------


def _digest(config: SlurmRunAllocationConfig | None = None, launcher=None,
            queue: SlurmQueueConfig | None = None) -> str:
    config = config or SlurmRunAllocationConfig()
    queue = queue or SlurmQueueConfig(partition="cpu")
    return session_digest(config.queue_for(queue), config, launcher or BashLauncher())


def test_digest_is_eight_hex_digits_and_stable() -> None:
    digest = _digest()
    assert re.fullmatch(r"[0-9a-f]{8}", digest)
    # equal but distinct objects give the same digest
    assert _digest(SlurmRunAllocationConfig(), BashLauncher()) == digest
    assert _digest(SlurmRunAllocationConfig(partition=None)) == digest


@pytest.mark.parametrize(
    "config",
    [
        SlurmRunAllocationConfig(partition="gpu"),
        SlurmRunAllocationConfig(num_nodes=2),
        SlurmRunAllocationConfig(mem="16G"),
        SlurmRunAllocationConfig(gpus_per_node=1),
        SlurmRunAllocationConfig(time_limit="90"),
        SlurmRunAllocationConfig(extra_sbatch_directives=["--constraint=a100"]),
    ],
)
def test_digest_changes_with_the_shape(config: SlurmRunAllocationConfig) -> None:
    assert _digest(config) != _digest()


def test_digest_changes_with_the_queue_shape() -> None:
    assert _digest(queue=SlurmQueueConfig(partition="gpu")) != _digest()
    assert _digest(queue=SlurmQueueConfig(partition="cpu", num_nodes=3)) != _digest()


def test_digest_changes_with_the_launcher() -> None:
    base = _digest()
    assert _digest(launcher=RayLauncher()) != base
    assert _digest(launcher=BashLauncher(pre_start_commands=["module load x"])) != base
    assert _digest(launcher=RayLauncher(num_gpus_per_node=1)) != _digest(launcher=RayLauncher())
    assert _digest(launcher=RayLauncher()) == _digest(launcher=RayLauncher())


def _slurm() -> SlurmResource:
    # lazily connecting transport: nothing is contacted while a RunSession is built
    return SlurmResource(
        ssh=SSHConnectionResource(host="login.invalid", user="u"),
        remote_base="/cluster/ds",
        queue=SlurmQueueConfig(partition="cpu", time_limit="60"),
    )


def test_run_session_names_follow_the_digest() -> None:
    slurm, config = _slurm(), SlurmRunAllocationConfig(num_nodes=2)
    session = RunSession(slurm, RUN_ID, config, BashLauncher(), activation=lambda: None)
    digest = session_digest(config.queue_for(slurm.queue), config, BashLauncher())
    assert session.digest == digest
    assert session.job_name == session_job_name(RUN_ID, digest)
    assert session.paths == SessionPaths.create("/cluster/ds", RUN_ID, digest)
    assert session.spec.job_name == session.job_name
    assert session.spec.num_nodes == 2 and session.spec.partition == "cpu"
    assert session.spec.output == session.paths.output
    assert session.spec.chdir == session.paths.session_dir
    assert not session.has_ray
    ray = RunSession(slurm, RUN_ID, config, RayLauncher(), activation=lambda: None)
    assert ray.has_ray and ray.job_name != session.job_name


def test_run_session_drain_signal_comes_from_the_signal_setting() -> None:
    slurm = _slurm()
    plain = RunSession(slurm, RUN_ID, SlurmRunAllocationConfig(), BashLauncher(),
                       activation=lambda: None)
    assert plain.drain_signal == "TERM"
    usr1 = RunSession(slurm, RUN_ID, SlurmRunAllocationConfig(signal_before_timeout="USR1@120"),
                      BashLauncher(), activation=lambda: None)
    assert usr1.drain_signal == "USR1"


# -- ready file --------------------------------------------------------------------------------


def test_parse_ready_reads_key_value_lines() -> None:
    text = "job_id=42\nhead=n1\nray_address=10.0.0.1:6379\nstarted_at=1700000000\n"
    assert parse_ready(text) == {
        "job_id": "42", "head": "n1", "ray_address": "10.0.0.1:6379", "started_at": "1700000000",
    }


def test_parse_ready_keeps_empty_values_and_later_equal_signs() -> None:
    assert parse_ready("ray_address=\nx=a=b\n") == {"ray_address": "", "x": "a=b"}


def test_parse_ready_ignores_lines_without_equal_sign_and_strips_blanks() -> None:
    assert parse_ready("garbage\n\n  head = n2  \r\n") == {"head": "n2"}
    assert parse_ready("") == {}


def test_parse_ready_last_value_wins() -> None:
    assert parse_ready("head=a\nhead=b\n") == {"head": "b"}
