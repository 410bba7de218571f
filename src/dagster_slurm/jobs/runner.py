"""The template every runner of ``compute.run`` follows (local, asset-scope Slurm, run scope).

In the style of Dagster's own Pipes clients: :meth:`PipesJobRunner.run` opens the Pipes
session with the context injector and message reader the runner prepared, then calls the
steps in order::

    context = op_context(context)         # asset, asset-check or op context -> op context
    job = _prepare(context, request)      # paths, checks, reader; nothing started yet
    with open_pipes_session(context, job.injector, job.reader, extras=...) as pipes:
        handle = _start(job, pipes)       # write files, submit / request / spawn
        try:
            result = _wait(job, handle)   # until the payload has ended
        except BaseException as exc:      # interrupt, termination, any failure
            _terminate(job, handle, exc)  # the payload must not outlive the step
            raise
    return _outcome(job, handle, result, pipes)   # metadata, cleanup, or a typed error

A payload its launcher knows does not open Pipes (a shell script, see
:meth:`~dagster_slurm.launchers.base.ComputeLauncher.payload_opens_pipes`) runs the same way,
without Dagster's warning that no Pipes message arrived (:mod:`dagster_slurm.pipes.quiet`);
so does a payload that never started (``_start`` failed, or ``_wait`` raised an error
:meth:`~PipesJobRunner._never_started` recognises, such as an unschedulable job).

A runner overrides only what differs. :meth:`~PipesJobRunner._terminate` is the one place
that reacts to an interrupt or a failure while waiting; it is not called when ``_wait``
returns, nor for a failure in ``_prepare``, ``_start`` or ``_outcome`` (``_start`` cleans up
a half-done start itself, as only it knows how far it got).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dagster import OpExecutionContext, PipesClientCompletedInvocation, open_pipes_session

from dagster_slurm.jobs.contexts import ExecutionContext, op_context
from dagster_slurm.jobs.errors import SlurmJobUnschedulable
from dagster_slurm.jobs.published_metadata import SlurmMetric
from dagster_slurm.jobs.run_log import step_log_relay
from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.quiet import pipes_warning_scope
from dagster_slurm.pipes.reader import PipesTailMessageReader


@dataclass(frozen=True)
class JobRequest:
    """One checked ``compute.run`` call, as the runners get it.

    ``payload_path``: the script or command. ``launcher``: renders the job script.
    ``extra_env``: validated variables for the payload. ``extras``: reach the payload as
    ``context.extras`` (None: none). ``overrides``: validated scheduler overrides (empty:
    none; only the asset-scope runner submits with them). ``defer_cleanup``: keep the
    invocation's files after success. ``published_metrics``: the figures to attach under
    the published package's metadata keys as well (None: only the ``dagster_slurm/*`` keys;
    see :mod:`dagster_slurm.jobs.published_metadata`).
    """

    payload_path: str
    launcher: ComputeLauncher
    extra_env: Mapping[str, str] = field(default_factory=dict)
    extras: Mapping[str, Any] | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    defer_cleanup: bool = False
    published_metrics: frozenset[SlurmMetric] | None = None


@dataclass
class PreparedJob:
    """What :meth:`PipesJobRunner._prepare` sets up for one call: the step's ``context``
    (its :class:`~dagster.OpExecutionContext`, whatever context the step was given),
    the ``request``, and the Pipes ``injector`` (writes the context file the launcher points
    the payload at) and ``reader`` (tails the messages, stdout and stderr files) the session
    is opened with. Runners subclass it for their own fields."""

    context: OpExecutionContext
    request: JobRequest
    injector: PipesDeferredFileContextInjector
    reader: PipesTailMessageReader


JobT = TypeVar("JobT", bound=PreparedJob)
HandleT = TypeVar("HandleT")
ResultT = TypeVar("ResultT")


class PipesJobRunner(ABC, Generic[JobT, HandleT, ResultT]):
    """Base of the runners: :meth:`run` is the template (see the module docstring).

    ``JobT``: the runner's :class:`PreparedJob`; ``HandleT``: what ``_start`` returns (a job
    id, a step handle, a process); ``ResultT``: what ``_wait`` returns, handed to ``_outcome``.
    """

    def run(self, context: ExecutionContext, request: JobRequest) -> PipesClientCompletedInvocation:
        """Run ``request`` for ``context``'s step through Dagster Pipes and return the
        completed invocation; raises the runner's typed error when the payload failed.
        ``context``: an asset, multi-asset, asset-check or op context; the steps below get
        its :class:`~dagster.OpExecutionContext` (:func:`~dagster_slurm.jobs.contexts.op_context`).
        Connection warnings meanwhile also go to the step's log
        (:func:`~dagster_slurm.jobs.run_log.step_log_relay`)."""
        op = op_context(context)
        with step_log_relay(op.log):
            return self._run(op, request)

    def _run(self, context: OpExecutionContext, request: JobRequest) -> PipesClientCompletedInvocation:
        job = self._prepare(context, request)
        opens_pipes = request.launcher.payload_opens_pipes(request.payload_path)
        with (
            pipes_warning_scope(context.log, payload=request.payload_path,
                                opens_pipes=opens_pipes) as no_messages,
            open_pipes_session(context, job.injector, job.reader, extras=dict(request.extras or {})) as pipes,
        ):
            try:
                handle = self._start(job, pipes)
            except BaseException:
                no_messages.never_started("the payload was not started")
                raise
            try:
                result = self._wait(job, handle)
            except BaseException as exc:
                reason = self._never_started(exc)
                if reason is not None:
                    no_messages.never_started(reason)
                self._terminate(job, handle, exc)
                raise
        return self._outcome(job, handle, result, pipes)

    def _never_started(self, error: BaseException) -> str | None:
        """Why the payload cannot have started, ``_wait`` having raised ``error``; None when
        it may have. Then Dagster's warning that no Pipes message arrived (which points at
        the payload's code) is not logged: the error says what happened."""
        if isinstance(error, SlurmJobUnschedulable):
            return f"job {error.outcome.job_id} could never start as submitted"
        return None

    @abstractmethod
    def _prepare(self, context: OpExecutionContext, request: JobRequest) -> JobT:
        """Paths, checks, the Pipes injector and reader; starts nothing."""

    @abstractmethod
    def _start(self, job: JobT, pipes: Any) -> HandleT:
        """Write the invocation's files and start the payload (``pipes``: the open Pipes
        session, for its bootstrap environment)."""

    @abstractmethod
    def _wait(self, job: JobT, handle: HandleT) -> ResultT:
        """Block until the payload has ended; return how it ended."""

    @abstractmethod
    def _terminate(self, job: JobT, handle: HandleT, error: BaseException) -> None:
        """``_wait`` raised ``error`` (an interrupt, run termination, a lost link, a fatal
        pending reason ...): stop the payload. Must not raise; ``error`` propagates after."""

    @abstractmethod
    def _outcome(self, job: JobT, handle: HandleT, result: ResultT, pipes: Any) -> PipesClientCompletedInvocation:
        """After the Pipes session has closed: the completed invocation with its metadata,
        or the typed error of a failed payload (raised); cleans up as configured."""
