"""One ``compute.run`` in Slurm mode with run scope: a job step inside the run's allocation.

Round trips: the session's allocation is found or submitted on first use (see
:mod:`dagster_slurm.session.session`); then one round trip writes the step's script, Pipes
context and uploaded payload and requests the step (after checking under the session lock
that the allocation is still current); one per status poll (status and drain files, with an
squeue of the allocation every few seconds); one per Pipes tail poll; one for cleanup.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from dagster import PipesClientCompletedInvocation, open_pipes_session

from dagster_slurm.agent import exec_op, remove_op
from dagster_slurm.compute.metrics import from_sacct
from dagster_slurm.compute.paths import step_identity
from dagster_slurm.compute.slurm_runner import notable_stdout_sink
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan, payload_argv
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.reader import PipesTailMessageReader
from dagster_slurm.pipes.sources import AgentFileSource
from dagster_slurm.session.config import check_shape
from dagster_slurm.session.errors import (
    SlurmAllocationEnded,
    SlurmStepDrained,
    SlurmStepExecutionResult,
    SlurmStepFailed,
)
from dagster_slurm.session.session import RunSession


def check_step(session: RunSession, launcher: ComputeLauncher, overrides: Mapping[str, Any],
               extra_slurm_opts: Mapping[str, Any] | None) -> None:
    """Refuse, before anything is submitted, a step the run allocation cannot host: another
    shape in ``extra_slurm_opts`` (the message names each differing field) or a Ray
    launcher when the allocation starts no Ray cluster."""
    check_shape(session.config, session.slurm.queue, overrides, extra_slurm_opts)
    from dagster_slurm.launchers.ray import RayLauncher

    if isinstance(launcher, RayLauncher) and not session.has_ray:
        raise ConfigurationError(
            "launcher", type(launcher).__name__,
            "the run allocation starts no Ray cluster; set the compute resource's "
            "default_launcher to a RayLauncher so that the allocation starts one",
        )


def step_launcher(launcher: ComputeLauncher) -> ComputeLauncher:
    """The launcher that writes a step's script inside the allocation: Bash launchers as
    they are; for Ray steps a Bash launcher (Ray already runs) that enters ``working_dir``."""
    from dagster_slurm.launchers.ray import RayLauncher

    if isinstance(launcher, RayLauncher):
        lines = list(launcher.pre_start_commands)
        if launcher.working_dir:
            lines.append(f"cd -- {shlex.quote(launcher.working_dir)} || exit 125")
        return BashLauncher(pre_start_commands=lines)
    return launcher


class SessionRunner:
    """Runs one payload as a job step of the run's allocation through Dagster Pipes."""

    def __init__(self, session: RunSession, *, poll_interval: float = 0.25) -> None:
        self.session = session
        self.poll_interval = poll_interval

    def run(
        self,
        *,
        context: Any,
        payload_path: str,
        launcher: ComputeLauncher,
        extra_env: Mapping[str, str],
        extras: Mapping[str, Any] | None,
        defer_cleanup: bool,
    ) -> PipesClientCompletedInvocation:
        session = self.session
        _run_id, step_key = step_identity(context)
        allocation = session.ensure(context.log)
        paths = allocation.invocation(step_key)
        payload = payload_argv(payload_path, job_dir=paths.job_dir)
        activation = session.activation()
        agent = session.slurm.agent()
        injector = PipesDeferredFileContextInjector(paths.context)
        reader = PipesTailMessageReader(
            AgentFileSource(agent), paths.messages, paths.stdout, paths.stderr,
            poll_interval=self.poll_interval, stdout_sink=notable_stdout_sink(context),
        )
        _publish_tags(context, allocation.job_id)
        with open_pipes_session(context, injector, reader, extras=dict(extras or {})) as pipes:
            env = {**pipes.get_bootstrap_env_vars(), **extra_env}
            if allocation.ray_address:
                env["RAY_ADDRESS"] = allocation.ray_address
            plan = ExecutionPlan(
                payload=payload.argv, job_dir=paths.job_dir, status_file=paths.status,
                drain_file=paths.drain, mode="slurm", env=env, activation=activation,
                drain_signal=allocation.drain_signal,
            )
            files: dict[str, tuple[str | bytes, int]] = {paths.context: (injector.payload, 0o600)}
            if payload.needs_upload:
                assert payload.upload_from is not None and payload.upload_name is not None
                with open(payload.upload_from, "rb") as handle:
                    files[paths.upload_target(payload.upload_name)] = (handle.read(), 0o644)
            handle = allocation.launch(paths, step_launcher(launcher).render(plan),
                                       name=step_key, files=files)
            reader.wake()
            context.log.info(
                f"Step {handle.name} requested in run allocation {allocation.job_id}; files in "
                f"{paths.job_dir}"
            )
            try:
                result = allocation.wait(handle)
            except SlurmAllocationEnded as ended:
                session.forget(allocation, ended.result.allocation_state)
                raise
            except BaseException as exc:
                if not isinstance(exc, Exception):  # run termination, KeyboardInterrupt
                    session.interrupted = True
                raise
        result = SlurmStepExecutionResult(
            result.job_id, result.step_name, result.exit_code, result.drained,
            result.drain_signal, result.allocation_state, reader.stdout_tail(), reader.stderr_tail(),
        )
        metrics = from_sacct(allocation.job_id, None, result.exit_code,
                             "COMPLETED" if result.exit_code == 0 else "FAILED")
        invocation = PipesClientCompletedInvocation(pipes, metadata=metrics.as_metadata())
        if result.drained:
            raise SlurmStepDrained(result, invocation)
        if result.exit_code != 0:
            raise SlurmStepFailed(result, f"files kept in {paths.job_dir}")
        if not defer_cleanup:
            with agent.batch() as batch:
                removed = batch.add(remove_op(paths.job_dir, root=paths.base))
                batch.add(exec_op(["rmdir", "--ignore-fail-on-non-empty", paths.step_dir]),
                          requires=[removed])
        context.log.info(f"Step {handle.name} completed in run allocation {allocation.job_id}")
        return invocation


def _publish_tags(context: Any, job_id: str) -> None:
    """Record the allocation's job id as a run tag (best effort; for operators and sensors)."""
    try:
        from dagster_slurm.session.lifecycle import run_id_of

        instance, run_id = context.instance, run_id_of(context)
        key = "dagster-slurm/allocation"
        run = instance.get_run_by_id(run_id)
        if run is not None and run.tags.get(key) != job_id:
            instance.add_run_tags(run_id, {key: job_id})
    except Exception:  # noqa: BLE001, S110 - tags are informational only
        pass
