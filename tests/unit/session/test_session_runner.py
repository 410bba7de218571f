"""Checks before a step enters the run allocation, and the script a step gets."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from dagster_slurm.compute.options import sbatch_overrides
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.frontend.lifecycle import sessions_of_run
from dagster_slurm.session.frontend.resource import SlurmSessionResource
from dagster_slurm.session.frontend.runner import (
    RECORD_STEP_ID,
    STEP_ID_FILE,
    check_step,
    step_launcher,
)
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.queue import SlurmQueueConfig

RUN_ID = "7d0b7a34-90c1-4a6e-8f0e-1b2c3d4e5f60"


def _slurm() -> SlurmResource:
    # the transport connects lazily: building a RunSession contacts nothing
    return SlurmResource(
        ssh=SSHConnectionResource(host="login.invalid", user="u"),
        remote_base="/cluster/ds",
        queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G"),
    )


def _session(launcher=None, **config) -> RunSession:
    return RunSession(_slurm(), RUN_ID, SlurmRunAllocationConfig(**config),
                      launcher or BashLauncher(), activation=lambda: None)


# -- check_step --------------------------------------------------------------------------------


def test_ray_step_on_an_allocation_without_ray_is_refused() -> None:
    session = _session(BashLauncher())
    with pytest.raises(ConfigurationError) as caught:
        check_step(session, RayLauncher(), {}, None)
    assert caught.value.field == "launcher"
    assert caught.value.value == "RayLauncher"
    assert "no Ray cluster" in str(caught.value)


def test_ray_step_on_a_ray_allocation_is_accepted() -> None:
    check_step(_session(RayLauncher()), RayLauncher(working_dir="/w"), {}, None)


@pytest.mark.parametrize("allocation", [BashLauncher(), RayLauncher()])
def test_bash_steps_fit_any_allocation(allocation) -> None:
    check_step(_session(allocation), BashLauncher(pre_start_commands=["true"]), {}, None)


def test_check_step_works_on_a_minimal_session_object() -> None:
    fake = SimpleNamespace(
        spec=SlurmRunAllocationConfig().queue_for(SlurmQueueConfig(partition="cpu"))
        .to_sbatch_spec("dsr-x", "/dev/null"),
        has_ray=False,
    )
    with pytest.raises(ConfigurationError, match="launcher"):
        check_step(fake, RayLauncher(), {}, None)  # type: ignore[arg-type]
    check_step(fake, BashLauncher(), {}, None)  # type: ignore[arg-type]


def test_another_shape_is_refused_before_the_launcher_check() -> None:
    opts = {"partition": "gpu"}
    with pytest.raises(ConfigurationError) as caught:
        check_step(_session(), RayLauncher(), sbatch_overrides(opts), opts)
    assert caught.value.field == "extra_slurm_opts"
    assert "partition" in str(caught.value) and "'gpu'" in str(caught.value)


def test_the_same_shape_in_other_spellings_is_accepted() -> None:
    opts = {"nodes": 1, "time": "30", "mem": "8G", "partition": "cpu"}
    check_step(_session(), BashLauncher(), sbatch_overrides(opts), opts)


def test_shape_is_checked_against_the_session_allocation_config() -> None:
    session = _session(num_nodes=2)
    opts = {"nodes": 2}
    check_step(session, BashLauncher(), sbatch_overrides(opts), opts)
    opts = {"nodes": 1}
    with pytest.raises(ConfigurationError, match="num_nodes: the step asks for 1"):
        check_step(session, BashLauncher(), sbatch_overrides(opts), opts)


# -- step_launcher -----------------------------------------------------------------------------


def _plan(job_dir: Path, payload: tuple[str, ...] = ("pwd",)) -> ExecutionPlan:
    return ExecutionPlan(
        payload=payload, job_dir=str(job_dir), status_file=str(job_dir / "status"),
        drain_file=str(job_dir / "drain"), mode="local",
    )


def test_bash_steps_record_their_step_id_before_their_own_setup_lines() -> None:
    launcher = step_launcher(BashLauncher(pre_start_commands=["module load x"]))
    assert type(launcher) is BashLauncher
    assert launcher.pre_start_commands == [RECORD_STEP_ID, "module load x"]
    assert RECORD_STEP_ID == f"printf '%s\\n' \"${{SLURM_STEP_ID:-}}\" > {STEP_ID_FILE} 2>/dev/null"


def test_the_step_id_line_writes_the_step_id(tmp_path: Path) -> None:
    subprocess.run(["/bin/bash", "-c", RECORD_STEP_ID], cwd=tmp_path, check=True,
                   env={"SLURM_STEP_ID": "7", "PATH": "/usr/bin:/bin"})
    assert (tmp_path / STEP_ID_FILE).read_text() == "7\n"


def test_ray_step_becomes_bash_that_enters_the_quoted_working_dir(tmp_path: Path) -> None:
    ray = RayLauncher(working_dir="/x y", pre_start_commands=["module load cuda"])
    launcher = step_launcher(ray)
    assert type(launcher) is BashLauncher
    assert launcher.pre_start_commands == [
        RECORD_STEP_ID, "module load cuda", "cd -- '/x y' || exit 125"]
    text = launcher.render(_plan(tmp_path))
    # the setup lines reach the script as one quoted word, evaluated before the payload
    expected = shlex.quote(f"{RECORD_STEP_ID}\nmodule load cuda\ncd -- '/x y' || exit 125")
    assert f"__ds_pre_start={expected}\n" in text
    assert "ray start" not in text  # Ray already runs in the allocation


def test_ray_step_without_working_dir_stays_in_the_job_dir() -> None:
    launcher = step_launcher(RayLauncher())
    assert type(launcher) is BashLauncher
    assert launcher.pre_start_commands == [RECORD_STEP_ID]


def _run(script: str, job_dir: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    path = job_dir / "step.sh"
    path.write_text(script)
    done = subprocess.run(["/bin/bash", str(path)], cwd=job_dir, capture_output=True,
                          text=True, timeout=30)
    status = (job_dir / "status").read_text().strip() if (job_dir / "status").exists() else ""
    return done, status


def test_rendered_ray_step_runs_in_its_working_dir(tmp_path: Path) -> None:
    job_dir, work = tmp_path / "job", tmp_path / "work dir; $(touch pwned)"
    job_dir.mkdir()
    work.mkdir()
    script = step_launcher(RayLauncher(working_dir=str(work))).render(_plan(job_dir))
    done, status = _run(script, job_dir)
    assert status == "0", done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(work)
    assert not (job_dir / "pwned").exists() and not (tmp_path / "pwned").exists()


def test_rendered_ray_step_fails_with_125_for_a_missing_working_dir(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    script = step_launcher(RayLauncher(working_dir=str(tmp_path / "missing"))).render(
        _plan(job_dir, ("touch", str(tmp_path / "payload-ran")))
    )
    _done, status = _run(script, job_dir)
    assert status == "125"
    assert not (tmp_path / "payload-ran").exists()


# -- SlurmSessionResource ----------------------------------------------------------------------


def _resource(**kwargs) -> SlurmSessionResource:
    return SlurmSessionResource(slurm=_slurm(), **kwargs)


def test_resource_gives_one_session_per_run_and_process() -> None:
    resource = _resource(run_allocation=SlurmRunAllocationConfig(num_nodes=2))
    try:
        first = resource.get_session(SimpleNamespace(run_id=RUN_ID))
        assert resource.get_session(SimpleNamespace(run_id=RUN_ID)) is first
        assert first.run_id == RUN_ID and first.spec.num_nodes == 2
        other = resource.get_session(SimpleNamespace(run_id=RUN_ID + "-2"))
        assert other is not first
    finally:
        sessions_of_run(RUN_ID)
        sessions_of_run(RUN_ID + "-2")


def test_resources_with_other_shapes_get_separate_sessions() -> None:
    small, big = _resource(), _resource(run_allocation=SlurmRunAllocationConfig(num_nodes=4))
    try:
        a = small.get_session(SimpleNamespace(run_id=RUN_ID))
        b = big.get_session(SimpleNamespace(run_id=RUN_ID))
        assert a is not b
        assert a.job_name != b.job_name and a.paths.session_dir != b.paths.session_dir
    finally:
        sessions_of_run(RUN_ID)


def test_resources_with_other_environments_get_separate_allocations() -> None:
    one = _resource(pre_deployed_env_path="/envs/a")
    two = _resource(pre_deployed_env_path="/envs/b")
    try:
        a = one.get_session(SimpleNamespace(run_id=RUN_ID))
        b = two.get_session(SimpleNamespace(run_id=RUN_ID))
        assert a is not b
        assert a.job_name != b.job_name
    finally:
        sessions_of_run(RUN_ID)


def test_resource_outside_a_run_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="context"):
        _resource().get_session(SimpleNamespace(run=None, run_id=None))


def test_resource_and_compute_resource_expose_the_same_session_entry_point() -> None:
    from dagster_slurm.compute.resource import ComputeResource

    resource = _resource()
    compute = ComputeResource(mode="slurm", slurm=_slurm(), allocation_scope="run")
    try:
        context = SimpleNamespace(run_id=RUN_ID)
        session = resource.get_run_allocation_session(context, start=False)
        assert session is resource.get_session(context)
        other = compute.get_run_allocation_session(context, start=False)
        assert type(session) is type(other)  # the object the session operations live on
    finally:
        sessions_of_run(RUN_ID)
