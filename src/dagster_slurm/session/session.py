"""``RunSession``: one Dagster run's shared allocation, as seen from one process.

Every process of a run (each step process under the multiprocess executor) builds its own
``RunSession`` for the run; they agree through the session document on the cluster
(``sessions/<run>/allocation.json``, changed only under its lock by the agent):

* **Exactly one allocation.** A process that finds no ``/allocation`` record submits with
  the agent's ``submit`` operation on the pointer ``/allocation``: the record (with the
  process's token) is written under the lock only if absent, then sbatch runs. Every other
  process gets a conflict and waits for the record's job id; a record of a dead submitter
  is settled by the token in squeue's comment column.
* **Reattachment.** A process (a retried step, a restarted supervisor) that finds a live
  allocation attaches to it; an allocation that ended after it had accepted steps is moved
  to ``/history/<job id>`` and replaced; one that ended before it accepted any step fails
  the step with the allocation's log tail (no resubmission loop).
* **Heartbeat.** While a process uses the session it writes ``/heartbeat`` (host, pid,
  login-node time) and rewrites the ``heartbeat`` file (new content) every ``heartbeat_interval`` seconds
  from one daemon thread, stopped by :meth:`RunSession.close`. The orphan sensor reads the
  former, the allocation's dead-man's switch the latter.
* **Teardown.** :meth:`RunSession.close` with ``cancel=True`` cancels every job carrying
  the session's job name (current allocation, a successor pending or running, anything
  pending) and marks the session closed, after which no process submits for it again.
* **Successors.** :meth:`RunSession.submit_successor` queues the run's next allocation and
  :meth:`RunSession.promote_successor` makes it the current one (see
  :mod:`dagster_slurm.session.successor`). While a successor is outstanding, a session
  whose allocation ended submits no new one: it asks for the promotion instead.
* **Extension points.** A subclass keeps its own state on the one session object, across
  submissions, promotions and attachments; it can override :meth:`RunSession._make_allocation`
  (every allocation object is made there) and :meth:`RunSession._clone_allocation_config`
  (a successor's configuration derived from the current allocation's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster_slurm.agent.exceptions import SubmissionInDoubt, SubmitGuardFailed
from dagster_slurm.backoff import sleep_checking
from dagster_slurm.errors import ConfigurationError, DagsterSlurmError, SchedulerError
from dagster_slurm.jobs.cancel import cancel_by_token
from dagster_slurm.jobs.errors import SlurmJobUnschedulable, SlurmSubmissionError
from dagster_slurm.jobs.logs import ProgressLog as _Log
from dagster_slurm.jobs.logs import notable_lines
from dagster_slurm.jobs.paths import safe_name
from dagster_slurm.jobs.pending import DEFAULT_FATAL_REASONS, PendingPolicy
from dagster_slurm.jobs.signals import drain_signal_of
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.launchers.script import render_template
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import new_token
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.session.allocation import SlurmAllocation
from dagster_slurm.session.config import SlurmRunAllocationConfig
from dagster_slurm.session.errors import (
    SessionError,
    SlurmAllocationEnded,
    SlurmStepExecutionResult,
)
from dagster_slurm.session.io import AgentSessionIO, SessionIO
from dagster_slurm.session.paths import SessionPaths, session_job_name
from dagster_slurm.session.run_layout import RunLayout, head_request, keep_a_worker
from dagster_slurm.session.successor import SuccessorAllocation, inherit_config, refuse_new_head
from dagster_slurm.session.watch import _ENDED, _Heartbeat, _ReadyWatch
from dagster_slurm.session.worker_removal import release_at_close
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import Allocation, new_session_document
from dagster_slurm.state.store import StateStore

if TYPE_CHECKING:
    from dagster_slurm.session.estimates import WorkerStartEstimate, WorkerStartEstimator
    from dagster_slurm.session.intents import ReconcileResult, WorkerIntent
    from dagster_slurm.session.snapshot import SessionSnapshot
    from dagster_slurm.session.worker_config import SlurmWorkerAllocationConfig
    from dagster_slurm.session.workers import WorkerAllocation

log = logging.getLogger("dagster_slurm.session")

SERVER_TEMPLATE = "session_server.sh"
#: Seconds a ``submitting`` record may stay without a job id before its token is looked up.
SUBMIT_GRACE_SECONDS = 150.0
#: Seconds after which a failed submission record no longer fails new steps (a retry submits).
FAILED_RECORD_SECONDS = 60.0


def render_server(paths: SessionPaths, token: str, drain_signal: str, heartbeat_timeout: float | None) -> str:
    """The step server script of one submission (see ``templates/session_server.sh``)."""
    return render_template(SERVER_TEMPLATE, {
        "session_dir": paths.session_dir,
        "heartbeat_file": paths.heartbeat,
        "heartbeat_timeout": "" if heartbeat_timeout is None else str(int(heartbeat_timeout)),
        "drain_signal": drain_signal,
        "launch_dir": paths.submit_dir(token),
    })


def session_digest(queue: Any, config: SlurmRunAllocationConfig, launcher: ComputeLauncher,
                   environment: Any = None, layout: RunLayout | None = None) -> str:
    """8 hex digits identifying an allocation's shape, launcher and environment settings
    and, with a ``layout`` (a separate head, a first worker allocation), that layout
    (resources that differ in any of them get separate sessions)."""
    parts = [queue.model_dump(mode="json"), config.snapshot(), type(launcher).__name__,
             launcher.model_dump(mode="json"), environment]
    if layout is not None:
        parts.append(layout.snapshot())
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class RunSession:
    """The run's shared allocation as used by this process; see the module docstring.

    ``activation`` returns the environment's activation script on the cluster (prepared on
    first use); ``environment`` describes the environment settings (JSON-able; part of the
    session's digest, so resources with other environments get other sessions).

    The cluster is reached through ``io`` (a :class:`~dagster_slurm.session.io.SessionIO`;
    None: the agent of ``slurm``), waits use ``clock`` (monotonic seconds) and ``sleep``;
    unit tests inject an in-memory cluster and a fake clock. Every change of the session
    document is a transition of :mod:`dagster_slurm.state.transitions`.

    ``follow`` (None: nothing) is called between polls whenever the session waits (for a
    submission, the queue, the allocation's startup, a step), with what it waits for; it
    raises to stop the wait: a :class:`~dagster_slurm.jobs.follow.RunFollower` of the
    session's Dagster run raises :class:`~dagster_slurm.jobs.follow.DagsterRunEnded` once
    the run is no longer running, and an allocation this process submitted is then cancelled.
    """

    def __init__(
        self,
        slurm: SlurmResource,
        run_id: str,
        config: SlurmRunAllocationConfig,
        launcher: ComputeLauncher,
        *,
        activation: Callable[[], str | None],
        pending: Any = None,
        poll_interval: float = 0.25,
        environment: Any = None,
        io: SessionIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        follow: Callable[[str], None] | None = None,
        layout: RunLayout | None = None,
    ) -> None:
        self.slurm = slurm
        self.run_id = run_id
        self.config = config
        self.launcher = launcher
        self.activation = activation
        self.pending = pending or PendingPolicy(DEFAULT_FATAL_REASONS)
        self.poll_interval = poll_interval
        #: How the run's Ray cluster spreads over allocations from the start (a separate
        #: head, a first worker allocation; see :mod:`dagster_slurm.session.run_layout`);
        #: None: one allocation hosts the head and the work.
        self.layout = layout
        #: The launcher that renders the head allocation's script (``launcher``, or a
        #: copy whose Ray node offers no CPUs or GPUs for a separate head).
        self.head_launcher = launcher if layout is None else layout.head_launcher(launcher)
        self.queue = head_request(config, slurm.queue, layout)  # checks the combination
        self.digest = session_digest(self.queue, config, launcher, environment, layout)
        self.paths = SessionPaths.create(slurm.base_path(), run_id, self.digest)
        self.job_name = session_job_name(run_id, self.digest)
        self.spec = self.queue.to_sbatch_spec(
            self.job_name, f"{self.paths.session_dir}/submit/allocation.sh",
            output=self.paths.output, error=self.paths.output, chdir=self.paths.session_dir,
        )
        self.drain_signal = drain_signal_of(self.queue.signal_before_timeout) or "TERM"
        self.interrupted = False
        self.io: SessionIO = io or AgentSessionIO(slurm, self.paths, self.initial_document())
        self.clock = clock
        self.sleep = sleep
        self.follow = follow
        self._allocation: SlurmAllocation | None = None
        self._lock = threading.RLock()
        self._heartbeat: _Heartbeat | None = None
        self._head_watch: Any = None  # a HeadWatch (session/head_watch.py) with the heartbeat
        self._closed = False
        self._used = False
        #: Called with the job id of a newly promoted allocation to publish the run tag
        #: ``dagster-slurm/allocation`` (None: no Dagster run to tag).
        self.publish_allocation: Callable[[str], None] | None = None

    def _pause(self, seconds: float, waiting_for: str) -> None:
        """Sleep between two polls, calling :attr:`follow` at least every second."""
        follow = self.follow
        sleep_checking(self.sleep, seconds,
                       None if follow is None else (lambda: follow(waiting_for)), 1.0)

    def initial_document(self) -> dict[str, Any]:
        """The document the session's first write creates."""
        return new_session_document(self.job_name, self.run_id)

    # -- the allocation --------------------------------------------------------------------
    @property
    def has_ray(self) -> bool:
        """True when the allocation starts a Ray cluster (its launcher is a RayLauncher)."""
        from dagster_slurm.launchers.ray import RayLauncher

        return isinstance(self.launcher, RayLauncher)

    @property
    def separate_head(self) -> bool:
        """True when the run's Ray cluster spans the head allocation and worker allocations
        from the start (a :attr:`layout`): every step process then watches the head."""
        return self.layout is not None

    @property
    def store(self) -> StateStore:
        """The session document's store (through ``io``)."""
        return self.io.store

    @property
    def allocation(self) -> SlurmAllocation:
        """The current allocation, submitted or attached to (and started) on first use."""
        return self.ensure()

    def ensure(self, logger: Any = None) -> SlurmAllocation:
        """The allocation the run's steps use now: this process's cached one, else the one
        the session document names (attached to), else a new submission. Waits until it
        accepts steps, logging the scheduler's pending reason and start estimate. With a
        :attr:`layout`, a process that gets the head ready this way then submits the first
        worker allocation again when the session has no live one
        (:func:`~dagster_slurm.session.run_layout.keep_a_worker`)."""
        with self._lock:
            if self._closed:
                raise SessionError(f"the run session {self.job_name} was closed in this process")
            if self._allocation is None:
                self._used = True
                self._start_heartbeat()
                allocation = self._acquire(_Log(logger))
                # once per process and head allocation: a session laid out with worker
                # allocations submits one when it has none left (see run_layout)
                keep_a_worker(self, logger)
                self._allocation = allocation
            return self._allocation

    def execute_in_session(
        self,
        command: str | Sequence[str],
        *,
        name: str = "step",
        env: Mapping[str, str] | None = None,
        raise_on_error: bool = True,
        logger: Any = None,
    ) -> SlurmStepExecutionResult:
        """Run ``command`` (a string split like a shell would, or an argv) as one step of the
        current allocation, in the session's environment, without Pipes; see
        :meth:`SlurmAllocation.execute`. An allocation that ends under the step raises
        :class:`~dagster_slurm.session.errors.SlurmAllocationEnded` and is replaced for the
        next step."""
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ConfigurationError("command", command, "must name a program to run")
        allocation = self.ensure(logger)
        try:
            return allocation.execute(argv, name=name, env=env, activation=self.activation(),
                                      raise_on_error=raise_on_error, on_poll=self.step_follow(name))
        except SlurmAllocationEnded as ended:
            self.forget(allocation, ended.result.allocation_state)
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.interrupted = True
            raise

    # -- successors ------------------------------------------------------------------------
    def replace_head(self, timeout: float | None = None, *, logger: Any = None) -> SlurmAllocation:
        """The session's healthy head allocation, electing one first when it has none (its
        job ended, its Ray stopped while the job runs, or it drains).

        Any number of processes may call it at once: the first caller claims the election
        and elects, the others wait, and all get the same head; a healthy head is returned
        unchanged (to move one, call ``request_drain()`` on it first). It elects a running
        published successor, else (a queued successor is promoted once it runs) a new
        allocation shaped like the first head. ``timeout``: seconds for the whole call
        (None: no limit); :class:`~dagster_slurm.session.head_election.HeadElectionTimeout`
        once it passed. See :mod:`dagster_slurm.session.head_election`."""
        from dagster_slurm.session.head_election import replace_head

        self._begin_use()
        return replace_head(self, timeout, logger)

    def submit_successor(self, config: SlurmRunAllocationConfig | None = None, *,
                         logger: Any = None) -> SuccessorAllocation:
        """Queue a successor of the current allocation and return once sbatch answered.

        Fields of ``config`` left unset take the current allocation's values, except
        ``extra_sbatch_directives`` (this submission's only; empty unless given). Raises
        :class:`SessionError` naming the outstanding successor when one is outstanding. The
        successor carries the session's job name: teardown cancels it, pending or running.
        """
        from dagster_slurm.session.successor import submit_successor

        self._begin_use()
        return submit_successor(self, config or SlurmRunAllocationConfig(), logger)

    def promote_successor(self, launcher: ComputeLauncher | None = None,
                          activation_script: str | None = None, *,
                          logger: Any = None, wait: float | None = None) -> SlurmAllocation:
        """Make the RUNNING successor the session's allocation (its Ray cluster started with
        the session's launcher and environment, or ``launcher`` / ``activation_script``),
        update the run tag and release the predecessor; returns the new allocation. Raises
        :class:`SessionError` saying why when the successor is not RUNNING or a predecessor
        payload is still active (running or waiting for srun). Repeating a completed
        promotion only publishes the tag and releases the predecessor again.

        ``wait``: None (the default) promotes only a successor that runs already; a number
        of seconds first waits that long for a queued successor to start, logging its
        pending reason and the scheduler's start estimate. Meanwhile a drained predecessor
        (drain requested, or its pre-walltime signal received) without an unfinished step is
        released, as the successor may be waiting for its nodes; one that is not drained is
        kept. A successor that does not start in time raises :class:`SessionError` and stays
        queued."""
        from dagster_slurm.session.successor import promote_successor

        self._begin_use()
        return promote_successor(self, launcher, activation_script, logger, wait)

    # -- scaling hooks (session/reconcile.py) ---------------------------------------------
    def inspect(self) -> SessionSnapshot:
        """One observation of every allocation of the session (head, published successor,
        worker allocations): scheduler facts, Ray membership, drain state and the
        bookkeeping of :meth:`reconcile_workers`, in one round trip and one scheduler query;
        waits for nothing. Values that could not be observed are None; when the scheduler
        did not answer every state is None and ``certain`` is False."""
        from dagster_slurm.session.reconcile import inspect

        return inspect(self)

    def reconcile_workers(self, intent: WorkerIntent, observed: SessionSnapshot | None = None,
                          release: Sequence[str] | None = None,
                          max_submissions: int | None = None, *,
                          max_observation_age: float = 300.0,
                          logger: Any = None) -> ReconcileResult:
        """Submit worker allocations of ``intent.config`` until ``intent.count`` of the
        intent's allocations are pending or running, or release the surplus (pending ones
        first, then the running ones with the least time left; each gets a drain deadline
        persisted before its drain starts). Safe from many processes at once (the session's
        reconcile lease is held from the scheduler query to the last submission). Submits
        nothing when the scheduler does not answer, when ``observed`` is older than
        ``max_observation_age`` seconds or names another head, beyond ``max_submissions``,
        or for a closed session: ``held_back`` says why. ``release`` names allocations of
        the intent to release in this call. Returns a
        :class:`~dagster_slurm.session.intents.ReconcileResult`."""
        from dagster_slurm.session.reconcile import reconcile_workers

        self._begin_use()
        return reconcile_workers(self, intent, observed, release, max_submissions,
                                 max_observation_age, logger)

    def assign_worker_intent(self, job_id: str, key: str | None) -> None:
        """Move the live worker allocation ``job_id`` into the intent ``key`` (counted and
        released by it from now on), or with None out of every intent (scale-in never
        releases it), under the session lock. An allocation being released keeps its intent
        until it ends (SessionError)."""
        from dagster_slurm.session.reconcile import assign_worker_intent

        assign_worker_intent(self, job_id, key)

    # -- worker allocations (session/workers.py, session/worker_removal.py) ----------------
    def add_worker_allocation(self, config: SlurmWorkerAllocationConfig,
                              logger: Any = None) -> WorkerAllocation:
        """Submit a worker allocation (a ``SlurmWorkerAllocationConfig``) whose nodes join
        the run's Ray cluster; returns its ``WorkerAllocation`` once sbatch answered."""
        from dagster_slurm.session.workers import add_worker_allocation

        self._begin_use()
        return add_worker_allocation(self, config, logger)

    def wait_for_worker_allocation(self, allocation: WorkerAllocation, timeout: float | None = None,
                                   logger: Any = None) -> list[str]:
        """Block until every node of ``allocation`` joined the run's Ray head (starting the
        head first if needed); their Ray node ids. Raises ``SessionError`` when the job
        ends first, ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
        from dagster_slurm.session.workers import wait_for_worker_allocation

        self._begin_use()
        return wait_for_worker_allocation(self, allocation, timeout, logger)

    def remove_worker_allocation(self, allocation: WorkerAllocation | str,
                                 drain_timeout: float = 600.0, wait: bool = True,
                                 logger: Any = None) -> JobState | None:
        """Remove a worker allocation (a handle of :attr:`worker_allocations`, or its job
        id) from the run's Ray cluster: one that has not started is cancelled; a running one
        is drained through Ray (running tasks and actors go on, each node leaves once idle,
        what still runs ``drain_timeout`` seconds from now is stopped). Returns the job's
        final Slurm state, normally COMPLETED (CANCELLED for one that had not started);
        with ``wait=False`` None at once, the follow-up running in a daemon thread. Never
        signals the head allocation or the payload drivers."""
        from dagster_slurm.session.worker_removal import remove_worker_allocation

        self._begin_use()
        return remove_worker_allocation(self, allocation, drain_timeout, wait, logger)

    @property
    def worker_allocations(self) -> list[WorkerAllocation]:
        """The session's live (not released) worker allocations, as the session document
        records them (a restarted supervisor finds them here, to remove them)."""
        from dagster_slurm.session.worker_removal import worker_allocations

        return worker_allocations(self)

    # -- start estimates (session/estimates.py) --------------------------------------------
    def worker_sbatch_options(self, candidates: Sequence[SlurmWorkerAllocationConfig]
                              ) -> list[list[str]]:
        """For each candidate (a ``SlurmWorkerAllocationConfig``), the sbatch options
        :meth:`add_worker_allocation` would submit now: inherited fields resolved, without
        the batch script's path and the per-submission ``--comment`` token. One read of the
        session document; nothing is submitted."""
        from dagster_slurm.session.estimates import worker_sbatch_options

        return worker_sbatch_options(self, candidates)

    def estimate_worker_starts(self, candidates: Sequence[SlurmWorkerAllocationConfig],
                               estimator: WorkerStartEstimator | None = None
                               ) -> list[WorkerStartEstimate]:
        """The scheduler's start estimate for each candidate worker allocation, in order
        (a ``WorkerStartEstimate``: ``start_in_seconds`` against the login node's clock,
        ``time_limit_seconds``, ``error`` for a rejected candidate, ``starts_within``).
        ``estimator``: any object with ``estimate(session, candidates)``; None: a shared
        ``SbatchTestOnlyEstimator()`` (``sbatch --test-only`` for all candidates in one SSH
        round trip, at most 8 per call, answers reused for 60 s). Nothing is queued or
        reserved."""
        from dagster_slurm.session.estimates import estimate_worker_starts

        return estimate_worker_starts(self, candidates, estimator)

    def _begin_use(self) -> None:
        with self._lock:
            if self._closed:
                raise SessionError(f"the run session {self.job_name} was closed in this process")
            self._used = True
            self._start_heartbeat()

    def step_follow(self, step: str) -> Callable[[], None]:
        """The ``on_poll`` of a wait on ``step``: calls :attr:`follow` (nothing without one)."""
        follow = self.follow
        if follow is None:
            return lambda: None
        return lambda: follow(f"step {step} of the run allocation")

    def forget(self, allocation: SlurmAllocation, state: str | None = None) -> None:
        """Stop using ``allocation`` (it ended); the next step gets a new one."""
        with self._lock:
            if self._allocation is allocation:
                self._allocation = None
        self._retire(allocation.job_id, "job_id", state)

    def _acquire(self, out: _Log) -> SlurmAllocation:
        """Attach to the head allocation the document names, or submit one; see the
        transitions of :mod:`dagster_slurm.state.transitions` for each state's edge."""
        waiting = PollBackoff(initial=0.2, maximum=0.5, factor=1.25)
        while True:
            read = self.io.read()
            doc = read.doc
            if doc is not None and doc.closed:
                raise SessionError(tr.closed_message(doc, self.job_name))
            state = tr.head_state(doc)
            record = doc.allocation if doc is not None else None
            if state is tr.HeadState.ABSENT:
                if doc is not None:
                    refuse_new_head(self, doc)  # an outstanding successor: promote it
                job_id, mine = self._submit(out, doc)
                if job_id is None:
                    self._pause(waiting.observe(False), "the run allocation's submission")
                    continue
                allocation = self._await_ready(job_id, out, mine)
                if allocation is not None:
                    return allocation
                continue
            assert record is not None
            if state in (tr.HeadState.SUBMITTED, tr.HeadState.READY, tr.HeadState.DRAINING):
                allocation = self._await_ready(str(record.job_id), out, False)
                if allocation is not None:
                    return allocation
                continue
            if state is tr.HeadState.SUBMITTING:
                age = read.now - float(record.submitted_at or read.now)
                if age < SUBMIT_GRACE_SECONDS:
                    self._pause(waiting.observe(False), "the run allocation's submission")
                    continue
                self._settle_in_doubt(record, out)
                continue
            finished = float(record.finished_at or record.submitted_at or 0)
            if read.now - finished < FAILED_RECORD_SECONDS:
                raise SlurmSubmissionError(
                    f"the run allocation could not be submitted ({record.status}): "
                    f"{(record.error or '').strip()}"
                )
            self._retire(record.token, "token", record.status)

    def _submit(self, out: _Log, doc: Any = None) -> tuple[str | None, bool]:
        """Submit the allocation; ``(None, False)`` when another process is submitting."""
        token = new_token()
        decided = tr.submit_head(doc, token=token, config=self.config.snapshot(),
                                 job_name=self.job_name)
        if isinstance(decided, tr.Refused):
            raise SessionError(decided.reason)
        submit_dir = self.paths.submit_dir(token)
        activation = self.activation()
        script, server = f"{submit_dir}/allocation.sh", f"{submit_dir}/step_server.sh"
        plan = ExecutionPlan(
            payload=("bash", server), job_dir=submit_dir, status_file=f"{submit_dir}/exit_status",
            drain_file=f"{submit_dir}/drain_signal", mode="slurm", activation=activation,
            num_nodes=self.spec.num_nodes or 1, drain_signal=self.drain_signal,
        )
        files: dict[str, tuple[str | bytes, int]] = {
            script: (self.head_launcher.render(plan), 0o600),
            server: (render_server(self.paths, token, self.drain_signal,
                                   self.config.heartbeat_timeout), 0o600),
            self.paths.heartbeat: (f"{socket.gethostname()} {os.getpid()} {time.time_ns()}\n", 0o600),
        }
        spec = dataclasses.replace(self.spec, script_path=script)
        try:
            job = self.io.submit(
                spec, files=files, token=token,
                record_value=tr.head_submission_record(self.config.snapshot()),
                create=self.initial_document(),
            )
        except (SubmissionInDoubt, SubmitGuardFailed):
            return None, False  # another record, or closed meanwhile: read the document again
        except SchedulerError as exc:
            raise SlurmSubmissionError(str(exc)) from None
        except BaseException:
            self._cancel_by_token(token, out)
            raise
        if job.recovered:
            return job.job_id, False
        out.info(
            f"Submitted run allocation {job.job_id} ({self.job_name}, partition "
            f"{spec.partition or 'default'}, {spec.num_nodes or 1} node(s), time limit "
            f"{spec.time_limit}{', starts Ray' if self.has_ray else ''}); session files in "
            f"{self.paths.session_dir}"
        )
        return job.job_id, True

    def _cancel_by_token(self, token: str, out: _Log) -> None:
        """An interrupted submission: cancel the job carrying ``token``, if it exists."""
        scheduler = self.io.scheduler
        if scheduler is not None:
            cancel_by_token(scheduler, self.job_name, token, out)

    def _await_ready(self, job_id: str, out: _Log, mine: bool) -> SlurmAllocation | None:
        """Wait until allocation ``job_id`` accepts steps. None: it had ended after serving
        steps (retired; the caller submits anew). Raises when it fails before that; an
        allocation this process submitted is cancelled when waiting for it fails."""
        watch = _ReadyWatch(self, job_id, out)
        try:
            while True:
                values = watch.poll()
                if values is _ENDED:
                    return None
                if values is not None:
                    return self._attached(job_id, values, out, mine)
                self._pause(watch.delay, f"run allocation {job_id}")
        except SlurmJobUnschedulable:
            self._cancel_quietly(job_id, out)
            self._retire(job_id, "job_id", "CANCELLED")
            raise
        except SessionError:
            if mine or watch.running_since is not None:
                self._cancel_quietly(job_id, out)
            raise
        except BaseException:
            if mine:
                self._cancel_quietly(job_id, out)
            raise

    # -- extension points ------------------------------------------------------------------
    def _make_allocation(self, job_id: str, nodes: tuple[str, ...], values: Mapping[str, Any],
                       config: Mapping[str, Any] | None = None) -> SlurmAllocation:
        """The allocation object of ``job_id`` (its ready file's ``values``); its drain
        signal is the one of ``config`` (the allocation's recorded configuration; None or
        empty: the session's).

        Extension point: every allocation object the session hands out is made here, for
        the allocation it submitted, one it attaches to (another process's, or after a
        restart) and a promoted successor. A subclass returns a subclass of
        :class:`SlurmAllocation` (site-specific steps, its own Ray start, extra facts);
        it has the session (``self``: configuration, ``slurm`` and its SSH connection,
        launcher, ``follow``) to pass on. ``nodes``: the allocation's hosts, head first;
        ``values``: its step server's ready file (``head``, ``ray_address``)."""
        signal = (config or {}).get("signal_before_timeout") or self.queue.signal_before_timeout
        return SlurmAllocation(
            self.io.scheduler, self.paths, self.job_name, job_id,  # type: ignore[arg-type]
            nodes=nodes, head=values.get("head") or None,
            ray_address=values.get("ray_address") or None,
            drain_signal=drain_signal_of(signal) or "TERM",
            poll_interval=self.poll_interval, clock=self.clock, sleep=self.sleep,
        )

    def _clone_allocation_config(self, current: Mapping[str, Any],
                                 given: SlurmRunAllocationConfig) -> SlurmRunAllocationConfig:
        """The configuration a successor is submitted with: ``given`` (what the caller
        passed to :meth:`submit_successor`) completed by ``current`` (the recorded
        configuration of the allocation it follows, a JSON-able mapping).

        The default fills every field the caller left unset from ``current``, except
        ``extra_sbatch_directives`` (see
        :func:`~dagster_slurm.session.successor.inherit_config`). Extension point: a
        subclass overrides it to carry over operational dependencies the default does not
        repeat (a license or reservation directive, fields of a
        :class:`SlurmRunAllocationConfig` subclass) or to refuse a successor. The result
        is validated like any configuration, recorded with the successor and returned as
        its ``config``; raise :class:`~dagster_slurm.errors.ConfigurationError` naming the
        field to refuse."""
        return inherit_config(current, given)

    def _attached(self, job_id: str, values: dict[str, Any], out: _Log, mine: bool) -> SlurmAllocation:
        nodes = tuple(self.io.read_lines(self.paths.nodes(job_id)))
        allocation = self._make_allocation(job_id, nodes, values, self._recorded_config(job_id))
        verb = "accepts steps" if mine else "found; attaching to it"
        out.info(
            f"Run allocation {job_id} {verb} (nodes {','.join(nodes) or '?'}"
            + (f", Ray at {allocation.ray_address}" if allocation.ray_address else "") + ")"
        )
        if mine:
            for line in notable_lines(self._log_tail(job_id, 200)):
                out.info(line)
            change = tr.record_ready(None, job_id=job_id, nodes=nodes,
                                     ray_address=allocation.ray_address)
            try:
                assert isinstance(change, tr.Change)
                if not self.io.apply(change).ok:
                    log.warning("did not record the nodes of allocation %s: the session no "
                                "longer has it as its head", job_id)
            except DagsterSlurmError as exc:
                log.warning("could not record the allocation's nodes: %s", exc)
        return allocation

    def _recorded_config(self, job_id: str) -> Mapping[str, Any] | None:
        """The configuration recorded with head allocation ``job_id`` (None: not known)."""
        try:
            doc = self.io.read().doc
        except DagsterSlurmError:
            return None
        record = doc.allocation if doc is not None else None
        return record.config if record is not None and record.job_id == job_id else None

    def _settle_in_doubt(self, record: Allocation, out: _Log) -> None:
        """A ``submitting`` record whose submitter vanished: find its job by token."""
        token = record.token
        if token is None:
            self._retire(None, "token", "unknown")
            return
        snapshot = self.io.queue([self.job_name])
        for job_id, queued in snapshot.queue.items():
            if queued.comment == token:
                change = tr.settle_found(None, token=token, job_id=job_id)
                assert isinstance(change, tr.Change)
                self.io.apply(change)
                out.info(f"Recovered run allocation {job_id} of an interrupted submission")
                return
        self._retire(token, "token", "unknown")

    def _retire(self, value: Any, key: str, state: str | None) -> None:
        """Move the ``/allocation`` record whose ``key`` is ``value`` to ``/history``."""
        if value is None:
            return
        for _attempt in range(5):
            decided = tr.retire(self.io.read().doc, key=key, value=str(value), final_state=state)
            if isinstance(decided, tr.Refused) or self.io.apply(decided).ok:
                return  # not (or no longer) the head record, or moved to history
        log.warning("could not retire allocation record %s=%s: it kept changing", key, value)

    def cleanup_step(self, step_key: str) -> None:
        """Remove the invocation files ``step_key`` kept (``defer_cleanup=True``) in every
        allocation the session has had; submits nothing."""
        from dagster_slurm.agent import remove_op

        doc = self.io.read().doc
        records = [] if doc is None else [doc.allocation, *doc.history.values()]
        job_ids = {str(r.job_id) for r in records if r is not None and r.job_id}
        if not job_ids:
            return
        with self.slurm.agent().batch() as batch:
            for job_id in sorted(job_ids):
                step_dir = f"{self.paths.steps_dir(job_id)}/{safe_name(step_key, 100)}"
                batch.add(remove_op(step_dir, root=self.paths.session_dir))

    # -- heartbeat and teardown ------------------------------------------------------------
    def beat(self) -> None:
        """One heartbeat: ``/heartbeat`` in the document and new content in the heartbeat
        file (the step server's dead-man's switch watches the content, not the mtime)."""
        host, pid = socket.gethostname(), os.getpid()
        change = tr.beat(None, host=host, pid=pid)
        assert isinstance(change, tr.Change)
        # new content every beat: the step server judges how long the content is unchanged
        self.io.beat(change, f"{host} {pid} {time.time_ns()}\n")

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self.beat()
            self._heartbeat = _Heartbeat(self, self.config.heartbeat_interval)
            self._heartbeat.start()
            if self.has_ray:
                from dagster_slurm.session.head_watch import HeadWatch

                self._head_watch = HeadWatch(self)
                self._head_watch.start()

    def close(self, *, cancel: bool, reason: str = "", logger: Any = None) -> None:
        """Stop the heartbeat; with ``cancel``, cancel every job of the session's name and
        mark the session closed (also when this process never used the allocation)."""
        with self._lock:
            self._closed = True
            heartbeat, self._heartbeat = self._heartbeat, None
            watch, self._head_watch = self._head_watch, None
        if heartbeat is not None:
            heartbeat.stop()
        if watch is not None:
            watch.stop()
        if cancel:
            self.cancel_all(reason, logger)

    def cancel_all(self, reason: str = "", logger: Any = None) -> None:
        """``scancel --name=<session job name>`` and mark the session closed."""
        out = _Log(logger)
        try:
            self.io.cancel(job_name=self.job_name)
            if not self._used:
                return  # this process never touched the session: leave no document behind
            change = tr.close_session(None, reason=reason or "teardown")
            assert isinstance(change, tr.Change)
            self.io.apply(change)
            release_at_close(self)
            out.info(f"Cancelled the run allocation(s) of {self.job_name}"
                     + (f" ({reason})" if reason else ""))
        except DagsterSlurmError as exc:
            out.error(f"could not cancel the run allocation(s) of {self.job_name}: {exc}; "
                      f"cancel them with `scancel --name={self.job_name}`")

    def _cancel_quietly(self, job_id: str, out: _Log) -> None:
        try:
            self.io.cancel([job_id])
            out.warning(f"Cancelled run allocation {job_id}")
        except DagsterSlurmError as exc:
            out.error(f"could not cancel run allocation {job_id}: {exc}; run `scancel {job_id}`")

    def _log_tail(self, job_id: str, lines: int = 30) -> str:
        try:
            text = self.io.tail(self.paths.output_of(job_id), lines)
        except DagsterSlurmError as exc:
            return f"(unreadable: {exc})"
        return text.rstrip() or "(empty)"
