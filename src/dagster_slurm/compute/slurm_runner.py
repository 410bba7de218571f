"""One ``compute.run`` in Slurm mode with asset scope: one job per invocation.

Round trips: one to write every file and submit (script, Pipes context, uploaded payload,
token record, sbatch), one per status poll (shared by all jobs of the process), one per
Pipes tail poll (messages, stdout and stderr together), and one for accounting and cleanup
together at the end. Interruption (run termination, KeyboardInterrupt) or any failure while
waiting cancels the job before the error propagates, so no job is left behind.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dagster import PipesClientCompletedInvocation, open_pipes_session

from dagster_slurm.agent import exec_op, remove_op
from dagster_slurm.agent.client import Batch
from dagster_slurm.compute.errors import (
    JobOutcome,
    SlurmJobLost,
    SlurmJobUnschedulable,
    SlurmSubmissionError,
)
from dagster_slurm.compute.metrics import from_sacct
from dagster_slurm.compute.outcome import outcome_error
from dagster_slurm.compute.paths import InvocationPaths, job_name_for, step_identity
from dagster_slurm.compute.pending import explain_pending
from dagster_slurm.errors import SchedulerError
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan, PayloadSpec, payload_argv
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.reader import PipesTailMessageReader
from dagster_slurm.pipes.sources import AgentFileSource
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import JobObservation, SlurmScheduler, new_token
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.scheduler.watcher import JobLost, JobWatcher
from dagster_slurm.slurm.commands import SbatchSpec

log = logging.getLogger("dagster_slurm.compute")

_WATCHERS: dict[int, JobWatcher] = {}
_WATCHERS_LOCK = threading.Lock()


def shared_watcher(scheduler: SlurmScheduler) -> JobWatcher:
    """One watcher per scheduler and process: one squeue per poll for all its jobs."""
    with _WATCHERS_LOCK:
        watcher = _WATCHERS.get(id(scheduler))
        if watcher is None:
            watcher = JobWatcher(scheduler, backoff=PollBackoff(initial=0.5, maximum=10.0))
            _WATCHERS[id(scheduler)] = watcher
        return watcher


@dataclass(frozen=True)
class PendingPolicy:
    """How to report and judge a job waiting in the queue.

    ``log_interval``: seconds between repeated "waiting" log lines (a changed reason is
    logged at once). ``fatal_reasons``: reason -> advice; a job pending for one of them
    longer than ``grace`` seconds is cancelled and fails with that advice.
    """

    fatal_reasons: Mapping[str, str]
    log_interval: float = 30.0
    grace: float = 10.0


class _PendingTracker:
    def __init__(
        self, job_id: str, policy: PendingPolicy, emit: Callable[[str], None],
        on_running: Callable[[], None] = lambda: None,
    ) -> None:
        self.on_running = on_running
        self.job_id = job_id
        self.policy = policy
        self.emit = emit
        self._last_reason: str | None = None
        self._last_log = float("-inf")
        self._fatal_since: float | None = None
        self._running_logged = False

    def __call__(self, obs: JobObservation) -> None:
        now = time.monotonic()
        if obs.state is not None and obs.state.pending:
            report = explain_pending(
                self.job_id, obs.reason, obs.start_time,
                fatal_reasons=self.policy.fatal_reasons, now=datetime.now(),
            )
            if obs.reason != self._last_reason or now - self._last_log >= self.policy.log_interval:
                self.emit(report.message)
                self._last_reason, self._last_log = obs.reason, now
            if report.fatal:
                self._fatal_since = self._fatal_since or now
                if now - self._fatal_since >= self.policy.grace:
                    raise SlurmJobUnschedulable(
                        JobOutcome(self.job_id, obs.state.value, None, reason=obs.reason),
                        f"pending with reason {obs.reason}: {report.advice}",
                    )
            else:
                self._fatal_since = None
        elif obs.state is not None and obs.state.active and not self._running_logged:
            nodes = ",".join(obs.queue.nodes or ()) if obs.queue else ""
            self.emit(f"Slurm job {self.job_id} is {obs.state.value}" + (f" on {nodes}" if nodes else ""))
            self._running_logged = True
            self.on_running()


class SlurmRunner:
    """Runs one payload as one Slurm job through Dagster Pipes."""

    def __init__(
        self,
        slurm: SlurmResource,
        pending: PendingPolicy,
        prepare_env: Callable[[Any], str | None],
        *,
        poll_interval: float = 0.25,
    ) -> None:
        self.slurm = slurm
        self.pending = pending
        self.prepare_env = prepare_env
        self.poll_interval = poll_interval

    def run(
        self,
        *,
        context: Any,
        payload_path: str,
        launcher: ComputeLauncher,
        extra_env: Mapping[str, str],
        extras: Mapping[str, Any] | None,
        overrides: Mapping[str, Any],
        defer_cleanup: bool,
    ) -> PipesClientCompletedInvocation:
        scheduler = self.slurm.scheduler()
        agent = scheduler.agent
        run_id, step_key = step_identity(context)
        paths = InvocationPaths.create(self.slurm.base_path(), run_id, step_key)
        job_name = job_name_for(run_id, step_key)
        payload = payload_argv(payload_path, job_dir=paths.job_dir)
        spec = self.slurm.queue.to_sbatch_spec(
            job_name, paths.script, output=paths.stdout, error=paths.stderr,
            chdir=paths.job_dir, **overrides,
        )  # validates every value before anything is sent
        activation = self.prepare_env(context)
        injector = PipesDeferredFileContextInjector(paths.context)
        reader = tail_reader(agent, paths, context, self.poll_interval)
        with open_pipes_session(context, injector, reader, extras=dict(extras or {})) as session:
            plan = ExecutionPlan(
                payload=payload.argv, job_dir=paths.job_dir, status_file=paths.status,
                drain_file=paths.drain, mode="slurm",
                env={**session.get_bootstrap_env_vars(), **extra_env},
                activation=activation, num_nodes=spec.num_nodes or 1,
                drain_signal=_drain_signal(self.slurm.queue.signal_before_timeout),
            )
            files = {paths.script: (launcher.render(plan), 0o600),
                     **invocation_files(paths, payload, injector)}
            job_id = self._submit(scheduler, spec, paths, files, context)
            observation = self._wait(scheduler, job_id, job_name, paths, context, reader.wake)
        outcome = JobOutcome(
            job_id, observation.state.value if observation.state else None,
            observation.exit_code, reader.stdout_tail(), reader.stderr_tail(),
        )
        error = outcome_error(observation.state, outcome)
        # Accounting and cleanup in one round trip. A failed job's files are kept for
        # debugging (its log says where they are).
        with agent.batch() as batch:
            acct = batch.add(scheduler.accounting_op([job_id])) if observation.state else None
            if not defer_cleanup and error is None:
                remove_invocation(batch, paths, paths.run_dir)
        record = scheduler.accounting_records(acct.result()).get(job_id) if acct else None
        metrics = from_sacct(job_id, record, observation.exit_code, outcome.state)
        if error is not None:
            raise error
        context.log.info(f"Slurm job {job_id} completed")
        return PipesClientCompletedInvocation(session, metadata=metrics.as_metadata())

    def _submit(self, scheduler: SlurmScheduler, spec: SbatchSpec, paths: InvocationPaths,
                files: dict[str, tuple[str | bytes, int]], context: Any) -> str:
        token = new_token()
        try:
            job = scheduler.submit(spec, state_path=paths.record, files=files, token=token)
        except SchedulerError as exc:
            raise SlurmSubmissionError(str(exc)) from None
        except BaseException:
            # Interrupted or disconnected mid-submission: the job may exist; find it by the
            # token in its comment and cancel it, so nothing is left behind.
            _cancel_by_token(scheduler, spec.job_name, token, context)
            raise
        context.log.info(
            f"Submitted Slurm job {job.job_id} ({spec.job_name}, partition "
            f"{spec.partition or 'default'}, {spec.num_nodes or 1} node(s), time limit "
            f"{spec.time_limit}); files in {paths.job_dir}"
        )
        return job.job_id

    def _wait(self, scheduler: SlurmScheduler, job_id: str, job_name: str,
              paths: InvocationPaths, context: Any, on_running: Callable[[], None]) -> JobObservation:
        watcher = shared_watcher(scheduler)
        watcher.track(job_id, job_name, status_file=paths.status)
        tracker = _PendingTracker(job_id, self.pending, context.log.info, on_running)
        try:
            return watcher.wait(job_id, on_poll=tracker)
        except JobLost as exc:
            raise SlurmJobLost(JobOutcome(job_id, None, None), str(exc)) from None
        except BaseException:
            # Termination, KeyboardInterrupt, an unschedulable job or a broken link: the job
            # must not outlive the step.
            _cancel_quietly(scheduler, job_id, context)
            raise
        finally:
            watcher.untrack(job_id)


def tail_reader(agent: Any, paths: InvocationPaths, context: Any,
                poll_interval: float) -> PipesTailMessageReader:
    """The Pipes reader of an invocation on the cluster: messages, stdout and stderr read in
    one round trip per poll; stdout also feeds :func:`notable_stdout_sink`."""
    return PipesTailMessageReader(
        AgentFileSource(agent), paths.messages, paths.stdout, paths.stderr,
        poll_interval=poll_interval, stdout_sink=notable_stdout_sink(context),
    )


def invocation_files(paths: InvocationPaths, payload: PayloadSpec,
                     injector: PipesDeferredFileContextInjector) -> dict[str, tuple[str | bytes, int]]:
    """Files an invocation writes before it starts (path -> (content, mode)): the Pipes
    context and, for a local script, the uploaded payload."""
    files: dict[str, tuple[str | bytes, int]] = {paths.context: (injector.payload, 0o600)}
    if payload.needs_upload:
        assert payload.upload_from is not None and payload.upload_name is not None
        with open(payload.upload_from, "rb") as handle:
            files[paths.upload_target(payload.upload_name)] = (handle.read(), 0o600)
    return files


def remove_invocation(batch: Batch, paths: InvocationPaths, *parents: str) -> None:
    """Add to ``batch`` the removal of the invocation's directory, then of its step
    directory and ``parents`` where they are left empty."""
    removed = batch.add(remove_op(paths.job_dir, root=paths.base))
    batch.add(exec_op(["rmdir", "--ignore-fail-on-non-empty", paths.step_dir, *parents]),
              requires=[removed])


#: Launcher output lines that also go to the Dagster log (not only to the compute logs).
NOTABLE_PREFIXES = ("Ray head node web UI:", "To reach it from your machine:")


def notable_stdout_sink(context: Any) -> Callable[[str], None]:
    """A stdout sink that writes every line to this process's stdout (Dagster's compute
    logs) and also logs the launcher's notable lines, such as the Ray dashboard URL."""

    def sink(line: str) -> None:
        sys.stdout.write(line if line.endswith("\n") else line + "\n")
        if line.startswith(NOTABLE_PREFIXES):
            context.log.info(line.rstrip("\n"))

    return sink


def _cancel_quietly(scheduler: SlurmScheduler, job_id: str, context: Any) -> None:
    try:
        scheduler.cancel([job_id])
        context.log.warning(f"Cancelled Slurm job {job_id}")
    except Exception as exc:  # noqa: BLE001 - the original error matters more
        message = f"could not cancel Slurm job {job_id}: {exc}; cancel it with `scancel {job_id}`"
        log.error(message)
        context.log.error(message)


def _cancel_by_token(scheduler: SlurmScheduler, job_name: str, token: str, context: Any) -> None:
    try:
        snapshot = scheduler.status([job_name])
    except Exception as exc:  # noqa: BLE001 - the original error matters more
        context.log.error(
            f"could not check whether the interrupted submission of {job_name} created a job "
            f"({exc}); look for comment {token} with `squeue --name={job_name} -o '%i %k'`"
        )
        return
    for job_id, record in snapshot.queue.items():
        if record.comment == token and record.state.active:
            _cancel_quietly(scheduler, job_id, context)


def _drain_signal(spec: str | None) -> str | None:
    """The signal name of a ``signal_before_timeout`` spec such as ``USR1@60`` (None: TERM)."""
    if not spec:
        return None
    return spec.split(":")[-1].split("@")[0] or None
