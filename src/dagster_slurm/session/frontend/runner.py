"""One ``compute.run`` in Slurm mode with run scope: a job step inside the run's allocation.

Round trips: the session's allocation is found or submitted on first use (see
:mod:`dagster_slurm.session.session`); one reads the call's record (attach to an invocation
an earlier attempt of the step started, or start fresh: :mod:`dagster_slurm.session.frontend.reattach`);
for a fresh invocation one round trip writes the step's script, Pipes context and uploaded
payload, requests the step (after checking under the session lock that the allocation is
still current) and writes the call's record; one per status poll (status and drain files,
with an squeue of the allocation every few seconds); one per Pipes tail poll; one per read
of the step's accounting (more than one only while accounting has not caught up); one that
removes the call's record (with the cleanup, when there is one).
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import OpExecutionContext, PipesClientCompletedInvocation

from dagster_slurm.agent import exec_op, remove_op, tail_op
from dagster_slurm.agent.results import TailRequest
from dagster_slurm.errors import ConfigurationError, DagsterSlurmError, LoginRequired
from dagster_slurm.jobs.cancel import keep_after_lost_login
from dagster_slurm.jobs.contexts import step_identity
from dagster_slurm.jobs.files import invocation_files, remove_invocation, tail_reader
from dagster_slurm.jobs.final_accounting import (
    ACCOUNTING_DEADLINE,
    AccountingAnswer,
    FinalRead,
    accounting_away,
    once_per_run,
    read_until_final,
    sacct_answer,
)
from dagster_slurm.jobs.follow import DagsterRunEnded
from dagster_slurm.jobs.metrics import SOURCE_SACCT, JobMetrics, from_step
from dagster_slurm.jobs.paths import InvocationPaths
from dagster_slurm.jobs.published_metadata import invocation_metadata
from dagster_slurm.jobs.runner import JobRequest, PipesJobRunner, PreparedJob
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan, PayloadSpec, payload_argv
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.scheduler.accounting_outlook import end_read_deadline
from dagster_slurm.session.core.allocation import (
    RECORD_STEP_ID,
    STEP_ID_FILE,
    STEP_SCRIPT,
    SlurmAllocation,
    StepHandle,
    new_request_id,
    step_name_for,
)
from dagster_slurm.session.core.config import refuse_mismatches
from dagster_slurm.session.core.errors import (
    SessionError,
    SlurmAllocationEnded,
    SlurmStepDrained,
    SlurmStepExecutionResult,
    SlurmStepFailed,
)
from dagster_slurm.session.frontend import reattach
from dagster_slurm.session.head.run_tag import publish_run_tag
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.accounting import SacctStep

log = logging.getLogger("dagster_slurm.session")


def check_step(session: RunSession, launcher: ComputeLauncher, overrides: Mapping[str, Any],
               extra_slurm_opts: Mapping[str, Any] | None) -> None:
    """Refuse, before anything is submitted, a step the run allocation cannot host: another
    shape in ``extra_slurm_opts`` (the message names each differing field) or a Ray
    launcher when the allocation starts no Ray cluster."""
    refuse_mismatches(session.spec, overrides, extra_slurm_opts)
    from dagster_slurm.launchers.ray import RayLauncher

    if isinstance(launcher, RayLauncher) and not session.has_ray:
        raise ConfigurationError(
            "launcher", type(launcher).__name__,
            "the run allocation starts no Ray cluster; set the compute resource's "
            "default_launcher to a RayLauncher so that the allocation starts one",
        )


def step_launcher(launcher: ComputeLauncher) -> ComputeLauncher:
    """The launcher that writes a step's script inside the allocation: a Bash launcher that
    first records the step id, then runs the launcher's own setup lines; for Ray steps (Ray
    already runs) it also enters ``working_dir``. Other launcher types render as they are."""
    from dagster_slurm.launchers.ray import RayLauncher

    if isinstance(launcher, RayLauncher):
        lines = [RECORD_STEP_ID, *launcher.pre_start_commands]
        if launcher.working_dir:
            lines.append(f"cd -- {shlex.quote(launcher.working_dir)} || exit 125")
        return BashLauncher(pre_start_commands=lines)
    if type(launcher) is BashLauncher:
        return BashLauncher(pre_start_commands=[RECORD_STEP_ID, *launcher.pre_start_commands])
    return launcher


@dataclass
class SessionStep(PreparedJob):
    """One run-scope invocation: its step key, the allocation it runs in, its files (inside
    the allocation's directory), payload, activation script (None: none) and agent.

    ``record_path`` and ``record``: the call's record (see
    :mod:`dagster_slurm.session.frontend.reattach`). ``attached``: the invocation an earlier attempt
    started, which this call attaches to (None: a fresh invocation)."""

    step_key: str
    allocation: SlurmAllocation
    paths: InvocationPaths
    payload: PayloadSpec
    activation: str | None
    agent: Any
    record_path: str
    record: reattach.CallRecord
    attached: StepHandle | None = None
    #: The scheduler's clock when the call was prepared: accounting that answered after it
    #: is only restarting if it fails at the step's end.
    prepared_at: float = 0.0


class SessionRunner(PipesJobRunner[SessionStep, StepHandle, SlurmStepExecutionResult]):
    """Runs one payload as a job step of the run's allocation through Dagster Pipes."""

    def __init__(self, session: RunSession, *, poll_interval: float = 0.25) -> None:
        self.session = session
        self.poll_interval = poll_interval

    def _prepare(self, context: OpExecutionContext, request: JobRequest) -> SessionStep:
        session = self.session
        run_id, step_key = step_identity(context)
        allocation = session.ensure(context.log)
        agent = session.slurm.agent()
        index = reattach.CALLS.next(run_id, step_key, reattach.attempt_of(context))
        record_path = session.paths.call_record(allocation.job_id, step_key, index)
        fingerprint = reattach.payload_fingerprint(request.payload_path, request.launcher)
        decision = reattach.decide(read_call_record(agent, record_path), job_id=allocation.job_id,
                                   payload=fingerprint)
        attached: StepHandle | None = None
        if isinstance(decision, reattach.Attach):
            record = decision.record
            paths = session.paths.invocation(allocation.job_id, step_key, record.invocation)
            _check_files(agent, paths, record_path)
            attached = StepHandle(record.request_id, record.step_name, paths)
        else:
            if decision.warning:
                context.log.warning(f"Call {index} of step {step_key} starts a fresh invocation: "
                                    f"{decision.reason}")
            paths = allocation.invocation(step_key)
            record = reattach.CallRecord(allocation.job_id, paths.invocation, new_request_id(),
                                         step_name_for(step_key), fingerprint)
        payload = payload_argv(request.payload_path, job_dir=paths.job_dir)
        activation = session.activation() if attached is None else None
        reader = tail_reader(agent, paths, context, self.poll_interval)
        publish_run_tag(context, allocation.job_id)
        return SessionStep(context, request, PipesDeferredFileContextInjector(paths.context), reader,
                           step_key, allocation, paths, payload, activation, agent,
                           record_path, record, attached, allocation.scheduler.now())

    def _start(self, job: SessionStep, pipes: Any) -> StepHandle:
        allocation, paths = job.allocation, job.paths
        if job.attached is not None:
            job.reader.wake()
            job.context.log.info(
                f"Step {job.attached.name} reattached to invocation {paths.invocation} in run "
                f"allocation {allocation.job_id} (started by an earlier attempt, request "
                f"{job.attached.request_id}); its Pipes messages are read from the start; files "
                f"in {paths.job_dir}"
            )
            return job.attached
        env = {**pipes.get_bootstrap_env_vars(), **job.request.extra_env}
        if allocation.ray_address:
            env["RAY_ADDRESS"] = allocation.ray_address
        plan = ExecutionPlan(
            payload=job.payload.argv, job_dir=paths.job_dir, status_file=paths.status,
            drain_file=paths.drain, mode="slurm", env=env, activation=job.activation,
            drain_signal=allocation.drain_signal,
        )
        handle = allocation.launch(paths, step_launcher(job.request.launcher).render(plan), name=job.step_key,
                                   files=invocation_files(paths, job.payload, job.injector),
                                   request_id=job.record.request_id,
                                   after={job.record_path: job.record.to_json()})
        job.reader.wake()
        job.context.log.info(
            f"Step {handle.name} requested in run allocation {allocation.job_id}; files in "
            f"{paths.job_dir}"
        )
        return handle

    def _wait(self, job: SessionStep, handle: StepHandle) -> SlurmStepExecutionResult:
        # _terminate cancels; the wait ends when the run does (the session's follower)
        return job.allocation.wait(handle, cancel_on_error=False,
                                   on_poll=self.session.step_follow(handle.name))

    def _terminate(self, job: SessionStep, handle: StepHandle, error: BaseException) -> None:
        if isinstance(error, SlurmAllocationEnded):
            # The allocation ended under the step: the next step gets a new one.
            self.session.forget(job.allocation, error.result.allocation_state)
            return
        if isinstance(error, LoginRequired):
            keep_after_lost_login(job.context.log, f"step {handle.name}")
            return
        _cancel_and_consume(job, handle)  # the step must not outlive its Dagster step
        if not isinstance(error, Exception) or isinstance(error, DagsterRunEnded):
            # run termination, KeyboardInterrupt, a run that ended: teardown cancels
            self.session.interrupted = True

    def _outcome(self, job: SessionStep, handle: StepHandle, result: SlurmStepExecutionResult,
                 pipes: Any) -> PipesClientCompletedInvocation:
        allocation, paths, reader = job.allocation, job.paths, job.reader
        result = SlurmStepExecutionResult(
            result.job_id, result.step_name, result.exit_code, result.drained,
            result.drain_signal, result.allocation_state, reader.stdout_tail(), reader.stderr_tail(),
        )
        # A failed step's figures are not reported: no second read of accounting for it.
        reported = result.drained or result.exit_code == 0
        metrics = step_metrics(allocation, paths, result.exit_code, warn=job.context.log.warning,
                                deadline=ACCOUNTING_DEADLINE if reported else 0.0,
                                started=job.prepared_at, run_id=step_identity(job.context)[0])
        invocation = PipesClientCompletedInvocation(
            pipes, metadata=invocation_metadata(metrics, job.request.published_metrics))
        succeeded = not result.drained and result.exit_code == 0
        _consume(job, remove=succeeded and not job.request.defer_cleanup, strict=succeeded)
        if result.drained:
            raise SlurmStepDrained(result, invocation)
        if result.exit_code != 0:
            raise SlurmStepFailed(result, f"files kept in {paths.job_dir}")
        job.context.log.info(f"Step {handle.name} completed in run allocation {allocation.job_id}")
        return invocation


def read_call_record(agent: Any, path: str) -> reattach.CallRecord | None:
    """The call record at ``path`` (None: there is none), in one round trip. Raises
    :class:`SessionError` naming the file when it cannot be read as a record: whether the
    invocation it names still runs is then unknown, and a second payload is not started on
    a guess."""
    chunk = agent.run(tail_op([TailRequest(path, 0, 64 * 1024)])).files[0]
    if not chunk.exists:
        return None
    try:
        return reattach.CallRecord.from_json(chunk.data.decode("utf-8", "replace"))
    except ValueError as exc:
        raise SessionError(
            f"the call record {path} cannot be read ({exc}); whether the invocation of an "
            "earlier attempt still runs is unknown. Check the step's invocations (under "
            "steps/<step key>/ of the same allocation directory) and its Slurm steps "
            "(`squeue -s`), then remove the file to let the call start afresh"
        ) from None


def _check_files(agent: Any, paths: InvocationPaths, record_path: str) -> None:
    """Before attaching, one round trip: the recorded invocation still has its step script
    (written before its request). Raises :class:`SessionError` when it has not (its files
    were removed): there would be no status to wait for, and whether its payload runs is
    unknown."""
    script = paths.file(STEP_SCRIPT)
    if not agent.run(tail_op([TailRequest(script, 0, 1)])).files[0].exists:
        raise SessionError(
            f"the call record {record_path} names invocation {paths.job_dir}, whose files are "
            "gone (removed by hand or by cleanup_deferred_run_dir?); whether its payload still "
            "runs is unknown. Check the allocation's steps (`squeue -s`), then remove the "
            "record to let the call start afresh"
        )


def _consume(job: SessionStep, *, remove: bool, strict: bool) -> None:
    """Remove the call's record (its outcome is read: a later call with the same key starts
    afresh), with ``remove`` then the invocation's files, in one round trip (the files only
    once the record is gone: a record never names an invocation without files). With
    ``strict`` a failure raises; otherwise it is logged (a failed or drained step's own
    error matters more)."""
    try:
        with job.agent.batch() as batch:
            removed = _remove_record(batch, job)
            if remove:
                remove_invocation(batch, job.paths, requires=[removed])
    except DagsterSlurmError as exc:
        if strict:
            raise
        job.context.log.warning(f"could not remove the call record {job.record_path} ({exc}); "
                                "a retry of the step attaches to this invocation again")


def _remove_record(batch: Any, job: SessionStep, requires: Sequence[Any] = ()) -> Any:
    """Add to ``batch`` the removal of the call's record and of its directory when empty;
    returns the record's removal (for ``requires``)."""
    removed = batch.add(remove_op(job.record_path, root=job.paths.base), requires=list(requires))
    calls = job.record_path.rsplit("/", 1)[0]
    batch.add(exec_op(["rmdir", "--ignore-fail-on-non-empty", calls, calls.rsplit("/", 1)[0]]),
              requires=[removed])
    return removed


def _cancel_and_consume(job: SessionStep, handle: StepHandle) -> None:
    """Cancel the step, then remove the call's record, in one round trip (the record only
    once the cancel request is written: a retry must never start a second payload next to a
    step whose cancel was lost). Logs, never raises: another error propagates."""
    allocation = job.allocation
    try:
        with job.agent.batch() as batch:
            cancelled = batch.add(allocation.cancel_op(handle))
            _remove_record(batch, job, [cancelled])
    except Exception as exc:  # noqa: BLE001 - logged; the original error propagates
        log.error("could not cancel step %s of allocation %s: %s; it ends with the allocation",
                  handle.name, allocation.job_id, exc)


def step_metrics(
    allocation: Any,
    paths: Any,
    exit_code: int | None,
    *,
    deadline: float = ACCOUNTING_DEADLINE,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    warn: Callable[[str], None] | None = None,
    started: float | None = None,
    run_id: str | None = None,
) -> JobMetrics:
    """The step's figures from accounting: each read is one round trip (the recorded step
    id and the allocation's sacct lines), repeated while the step's line shows no final
    state (sacct behind, or failing after it answered since ``started``, the scheduler's
    clock when the step was prepared), for at most ``deadline`` seconds. Accounting that is
    disabled or away since before the step is not waited for. Best effort: without a final
    line the state comes from the step's exit-status file and the figures stay null, said
    through ``warn`` (default: this module's logger) unless ``deadline`` is 0 (one read,
    for figures that will not be reported), and once per ``run_id`` when sacct failed; no
    error is raised."""
    from dagster_slurm.agent import tail_op
    from dagster_slurm.agent.results import TailRequest

    scheduler = allocation.scheduler

    def read() -> tuple[str | None, AccountingAnswer]:
        with scheduler.agent.batch() as batch:
            recorded = batch.add(tail_op([TailRequest(paths.file(STEP_ID_FILE), 0, 256)]))
            acct = batch.add(scheduler.accounting_op([allocation.job_id]))
        step_id = recorded.result().files[0].data.decode("utf-8", "replace").strip() or None
        return step_id, sacct_answer(scheduler, allocation.job_id, acct.result())

    def settled(value: tuple[str | None, AccountingAnswer]) -> bool:
        step_id, answer = value
        step = _step_line(answer, step_id)
        return step_id is None or (step is not None and step.state.terminal)

    reported = deadline > 0
    try:
        first: tuple[str | None, AccountingAnswer] | None = read()
    except Exception as exc:  # noqa: BLE001 - reported below, like a failed later read
        first, error = None, exc
    else:
        error = None
        away = accounting_away(first[1])
        if started is not None and away is not None:
            deadline = end_read_deadline(scheduler.accounting_outlook.view(), away, started,
                                         deadline)
    got = (FinalRead(None, False, 0, 0.0, error) if first is None else
           read_until_final(read, settled, first=first, deadline=deadline, clock=clock,
                            sleep=sleep))
    step_id, answer = got.value if got.value is not None else (None, None)
    line = _step_line(answer, step_id)
    metrics = from_step(allocation.job_id, line, step_id, exit_code, allocation.head)
    warn = warn or log.warning
    if got.error is not None and got.value is None:
        warn(f"step metrics of allocation {allocation.job_id} not read "
             f"({type(got.error).__name__}: {got.error}); they stay null")
    elif step_id is not None and metrics.state_source != SOURCE_SACCT and reported:
        used = (f"state {metrics.state} from the step's exit-status file" if metrics.state
                else "no state (the step's exit status is unknown)")
        said = (f"Accounting of step {metrics.job_id} showed no final state after {got.attempts} "
                f"read(s) over {got.waited:.1f} s ({_said(answer, line, got.error)}); the "
                f"metadata reports {used}, and elapsed time, node-hours, CPU efficiency, MaxRSS "
                "and the GPU figures as null")
        told = (once_per_run(said, answer, scheduler.accounting_outlook, run_id)
                if run_id is not None else said)
        if told is not None:
            warn(told)
    return metrics


def _step_line(answer: AccountingAnswer | None, step_id: str | None) -> SacctStep | None:
    """The sacct line of step ``step_id`` in ``answer`` (None when it has none)."""
    if answer is None or answer.record is None or step_id is None:
        return None
    return next((s for s in answer.record.steps if s.step_id == step_id), None)


def _said(answer: AccountingAnswer | None, line: SacctStep | None,
          error: BaseException | None) -> str:
    """What the last accounting answer said about a step, for the warning."""
    if line is not None:
        said = f"sacct said {line.state.value} for the step"
    elif answer is not None and answer.record is not None:
        said = "sacct had no line for the step"
    else:
        said = answer.describe() if answer is not None else "no answer"
    return said if error is None else f"{said}; reading stopped on {type(error).__name__}: {error}"

