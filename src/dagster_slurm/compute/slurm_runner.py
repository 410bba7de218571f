"""One ``compute.run`` in Slurm mode with asset scope: one job per invocation.

Round trips: one to write every file and submit (script, Pipes context, uploaded payload,
heartbeat file, token record, sbatch), one per status poll (shared by all jobs of the
process, served from the user's shared squeue answer; it also rewrites each job's heartbeat
file, the job's dead-man's switch), one per Pipes tail poll (messages, stdout, stderr and a
look for the exit-status file together: once it appears, the status poll happens at once,
see :data:`FIRST_POLL`), and one for accounting and cleanup
together at the end (then one per further read of accounting while it has not caught up
with a job that ended, for at most ``accounting_deadline`` seconds). While waiting, the step
reads its own run's status from the Dagster instance every ``run_status_interval`` seconds
(:mod:`dagster_slurm.jobs.follow`): a run that is no longer running (its run worker died, it
was terminated) stops the wait with :class:`~dagster_slurm.jobs.follow.DagsterRunEnded`.
Interruption (run termination, KeyboardInterrupt), an ended run, or any failure while
waiting cancels the job before the error propagates, so no job is left behind; a job that
left the queue unobserved (:class:`~dagster_slurm.jobs.errors.SlurmJobLost`) is not
cancelled, as there is nothing left to cancel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster import OpExecutionContext, PipesClientCompletedInvocation

from dagster_slurm.errors import LoginRequired, SchedulerError
from dagster_slurm.jobs.cancel import cancel_by_token, cancel_quietly, keep_after_lost_login
from dagster_slurm.jobs.contexts import step_identity
from dagster_slurm.jobs.cost import requested_memory_bytes
from dagster_slurm.jobs.errors import JobOutcome, SlurmJobLost, SlurmSubmissionError
from dagster_slurm.jobs.files import invocation_files, remove_invocation, tail_reader
from dagster_slurm.jobs.final_accounting import (
    ACCOUNTING_DEADLINE,
    job_accounting,
    lag_warning,
    observed_metrics,
    once_per_run,
)
from dagster_slurm.jobs.follow import DEFAULT_RUN_STATUS_INTERVAL, follower_for
from dagster_slurm.jobs.metrics import observed_wait
from dagster_slurm.jobs.outcome import outcome_error
from dagster_slurm.jobs.paths import InvocationPaths, job_name_for
from dagster_slurm.jobs.pending import PendingPolicy, PendingTracker, nodes_of
from dagster_slurm.jobs.published_metadata import invocation_metadata
from dagster_slurm.jobs.runner import JobRequest, PipesJobRunner, PreparedJob
from dagster_slurm.jobs.signals import drain_signal_of
from dagster_slurm.launchers.base import ExecutionPlan, PayloadSpec, payload_argv
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import JobObservation, SlurmScheduler, new_token
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.scheduler.watcher import JobLost, JobWatcher, heartbeat_content
from dagster_slurm.slurm.commands import SbatchSpec

__all__ = ["PendingPolicy", "SlurmRunner", "shared_watcher"]

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


#: Seconds from the start of the wait to the first status poll: a job that ends sooner is
#: seen ending through its exit-status file (read with the Pipes tail, no scheduler call),
#: which makes the watcher poll at once; so it costs one squeue.
FIRST_POLL = 1.0


class _StatusSeen:
    """Called by the Pipes reader when the job's exit-status file appeared: tells the
    watcher (once the job id is known; a file seen earlier is passed on when it is)."""

    def __init__(self, scheduler: SlurmScheduler) -> None:
        self.scheduler = scheduler
        self.job_id: str | None = None
        self.seen = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.seen = True
            job_id = self.job_id
        if job_id is not None:
            shared_watcher(self.scheduler).payload_ended(job_id)

    def tracking(self, job_id: str) -> None:
        with self._lock:
            self.job_id = job_id
            seen = self.seen
        if seen:
            shared_watcher(self.scheduler).payload_ended(job_id)


@dataclass
class SlurmJob(PreparedJob):
    """One asset-scope invocation: its scheduler, files, job name, payload, validated sbatch
    spec, activation script (None: no environment to source) and the hook through which the
    Pipes reader reports the exit-status file."""

    scheduler: SlurmScheduler
    paths: InvocationPaths
    job_name: str
    payload: PayloadSpec
    spec: SbatchSpec
    activation: str | None
    status_seen: _StatusSeen
    #: The scheduler's clock when the call was prepared (before the submission): accounting
    #: that answered after it is only restarting if it fails at the job's end.
    prepared_at: float = 0.0
    #: This process's monotonic clock when sbatch answered, and at the first status poll
    #: that saw the job started (None until then): the queue wait the library observed,
    #: used where accounting has no ``Planned`` figure.
    submitted_at: float | None = None
    started_at: float | None = None


class SlurmRunner(PipesJobRunner[SlurmJob, str, JobObservation]):
    """Runs one payload as one Slurm job through Dagster Pipes (handle: the job id)."""

    def __init__(
        self,
        slurm: SlurmResource,
        pending: PendingPolicy,
        prepare_env: Callable[[OpExecutionContext], str | None],
        *,
        poll_interval: float = 0.25,
        run_status_interval: float = DEFAULT_RUN_STATUS_INTERVAL,
        heartbeat_timeout: float | None = None,
        accounting_deadline: float | None = None,
    ) -> None:
        self.slurm = slurm
        self.pending = pending
        self.prepare_env = prepare_env
        self.poll_interval = poll_interval
        self.run_status_interval = run_status_interval
        self.heartbeat_timeout = heartbeat_timeout
        """Seconds without a poll after which the job cancels itself; None: never."""
        #: Seconds a finished job's accounting is read again while it shows no final state
        #: (None: :data:`~dagster_slurm.jobs.final_accounting.ACCOUNTING_DEADLINE`).
        self.accounting_deadline = (ACCOUNTING_DEADLINE if accounting_deadline is None
                                    else accounting_deadline)

    def _prepare(self, context: OpExecutionContext, request: JobRequest) -> SlurmJob:
        scheduler = self.slurm.scheduler()
        run_id, step_key = step_identity(context)
        paths = InvocationPaths.create(self.slurm.base_path(), run_id, step_key)
        job_name = job_name_for(run_id, step_key)
        payload = payload_argv(request.payload_path, job_dir=paths.job_dir)
        spec = self.slurm.queue.to_sbatch_spec(
            job_name, paths.script, output=paths.stdout, error=paths.stderr,
            chdir=paths.job_dir, **request.overrides,
        )  # validates every value before anything is sent
        activation = self.prepare_env(context)
        status_seen = _StatusSeen(scheduler)
        return SlurmJob(
            context, request, PipesDeferredFileContextInjector(paths.context),
            tail_reader(scheduler.agent, paths, context, self.poll_interval, on_status=status_seen),
            scheduler, paths, job_name, payload, spec, activation, status_seen,
            scheduler.now(),
        )

    def _start(self, job: SlurmJob, pipes: Any) -> str:
        paths, spec = job.paths, job.spec
        plan = ExecutionPlan(
            payload=job.payload.argv, job_dir=paths.job_dir, status_file=paths.status,
            drain_file=paths.drain, mode="slurm",
            env={**pipes.get_bootstrap_env_vars(), **job.request.extra_env},
            activation=job.activation, num_nodes=spec.num_nodes or 1,
            drain_signal=drain_signal_of(self.slurm.queue.signal_before_timeout),
            heartbeat_file=paths.heartbeat if self.heartbeat_timeout is not None else None,
            heartbeat_timeout=self.heartbeat_timeout,
            restart_allowed=spec.requeue,
        )
        # The heartbeat file exists from the submission on (a job that starts before the
        # first poll finds content), and is rewritten by every poll, limit or not (the
        # orphan reconciliation reads it too). The record names the run and step, so the
        # reconciliation can tell whose job this is from the record alone.
        files = {paths.script: (job.request.launcher.render(plan), 0o600),
                 **invocation_files(paths, job.payload, job.injector),
                 paths.heartbeat: (heartbeat_content(0), 0o600)}
        token = new_token()
        run_id, step_key = step_identity(job.context)
        owner = {"run_id": run_id, "step_key": step_key, "job_name": spec.job_name}
        follower = follower_for(job.context, self.run_status_interval)
        waits = self.slurm.limit_wait(
            job.context.log.info, lambda: follower.check(f"a free slot to submit {spec.job_name}"))
        try:
            submitted = job.scheduler.submit(spec, state_path=paths.record, files=files,
                                             token=token, record_value=owner, limit_wait=waits)
        except SchedulerError as exc:
            raise SlurmSubmissionError(str(exc)) from None
        except BaseException:
            # Interrupted or disconnected mid-submission: the job may exist; find it by the
            # token in its comment and cancel it, so nothing is left behind.
            cancel_by_token(job.scheduler, spec.job_name, token, job.context.log)
            raise
        job.submitted_at = time.monotonic()
        others = "".join(f" + {c.num_nodes or 1} node(s) in {c.partition or 'the same partition'}"
                         for c in spec.het_components)  # a heterogeneous job's later components
        job.context.log.info(
            f"Submitted Slurm job {submitted.job_id} ({spec.job_name}, partition "
            f"{spec.partition or 'default'}, {spec.num_nodes or 1} node(s){others}, time limit "
            f"{spec.time_limit}); files in {paths.job_dir}"
        )
        return submitted.job_id

    def _wait(self, job: SlurmJob, handle: str) -> JobObservation:
        watcher = shared_watcher(job.scheduler)
        if self.heartbeat_timeout is not None:
            # A short limit (allowed for test clusters) must not end a job whose step polls
            # at the normal ceiling of 10 s: poll at least four times per limit.
            watcher.backoff.cap(self.heartbeat_timeout / 4)
        watcher.track(handle, job.job_name, status_file=job.paths.status,
                      heartbeat_file=job.paths.heartbeat)
        job.status_seen.tracking(handle)
        tracker = PendingTracker(
            handle, self.pending, job.context.log.info, job.reader.wake,
            warn=job.context.log.warning,
            requeue_note=("the payload starts again from the beginning when the job runs "
                          "(requeue=True)" if job.spec.requeue else
                          "it was submitted with --no-requeue, so its script will not start "
                          "the payload again and the step fails"),
        )
        follower = follower_for(job.context, self.run_status_interval)

        def follow() -> None:
            follower.check(f"Slurm job {handle}")

        def on_poll(observation: JobObservation) -> None:
            state = observation.state
            if (job.started_at is None and state is not None and state.active
                    and not state.pending):
                job.started_at = time.monotonic()  # the first start, to within a poll
            tracker(observation)
            if not observation.terminal:
                follow()

        try:
            return watcher.wait(handle, on_poll=on_poll, check=follow,
                                check_interval=self.run_status_interval, first_poll=FIRST_POLL)
        except JobLost as exc:
            raise SlurmJobLost(JobOutcome(handle, None, None), str(exc)) from None
        finally:
            watcher.untrack(handle)

    def _terminate(self, job: SlurmJob, handle: str, error: BaseException) -> None:
        # Termination, KeyboardInterrupt, an unschedulable job or a broken link: the job must
        # not outlive the step. This cancels the step's own job because the step is failing,
        # not because the scheduler's answer was unknown: a job left running after its step
        # failed would still be materialized by nobody and could repeat work on a retry.
        # A lost job has left the queue: nothing to cancel.
        if isinstance(error, LoginRequired):
            keep_after_lost_login(job.context.log, f"job {handle}")
            return
        if not isinstance(error, SlurmJobLost):
            cancel_quietly(job.scheduler, handle, job.context.log)

    def _outcome(self, job: SlurmJob, handle: str, result: JobObservation,
                 pipes: Any) -> PipesClientCompletedInvocation:
        scheduler, paths, reader = job.scheduler, job.paths, job.reader
        outcome = JobOutcome(
            handle, result.state.value if result.state else None,
            result.exit_code, reader.stdout_tail(), reader.stderr_tail(), nodes=nodes_of(result),
        )
        error = outcome_error(result.state, outcome)
        # Accounting and cleanup in one round trip. A failed job's files are kept for
        # debugging (its log says where they are).
        with scheduler.agent.batch() as batch:
            acct = batch.add(scheduler.accounting_op([handle])) if result.state else None
            if not job.request.defer_cleanup and error is None:
                remove_invocation(batch, paths, paths.run_dir)
        # Accounting may not have caught up (slurmdbd late or away): read again until it
        # shows a final state, else report what was observed (see jobs/final_accounting.py).
        # A failed job's figures are not reported: no second read for it.
        deadline = self.accounting_deadline if error is None else 0.0
        read = (job_accounting(scheduler, handle, acct.result(), deadline=deadline,
                               started=job.prepared_at) if acct else None)
        if error is not None:
            raise error
        metrics = observed_metrics(result, read, requested_mem_bytes=requested_memory_bytes(job.spec),
                                   observed_wait=observed_wait(job.submitted_at, job.started_at))
        warning = (once_per_run(lag_warning(handle, read, metrics), read.value,
                                scheduler.accounting_outlook, step_identity(job.context)[0])
                   if read is not None else None)
        if warning is not None:
            job.context.log.warning(warning)
        job.context.log.info(f"Slurm job {handle} completed")
        return PipesClientCompletedInvocation(
            pipes, metadata=invocation_metadata(metrics, job.request.published_metrics))
