"""``RunSession``: one Dagster run's shared allocation, as seen from one process.

Every process of a run (each step process under the multiprocess executor) builds its own
``RunSession`` for the run; they agree through the session document on the cluster
(``sessions/<run>/allocation.json``, changed only under its lock by the agent, through the
transitions of :mod:`dagster_slurm.state`).

``RunSession`` is the public front: it composes a
:class:`~dagster_slurm.session.core.context.SessionContext` and delegates each operation to
the feature that owns it, in one line:

* the head allocation: :mod:`dagster_slurm.session.head` (acquire, successors, hand-over,
  election, a worker-hosted head);
* worker allocations: :mod:`dagster_slurm.session.workers`;
* the scaling hooks: :mod:`dagster_slurm.session.scaling`;
* the head watch: :mod:`dagster_slurm.session.supervision`.

* **Heartbeat.** While a process uses the session it writes ``/heartbeat`` (host, pid,
  login-node time) and rewrites the ``heartbeat`` file (new content) every
  ``heartbeat_interval`` seconds from one daemon thread, stopped by :meth:`RunSession.close`.
  The orphan sensor reads the former, the allocation's dead-man's switch the latter. With a
  Ray launcher a second daemon thread watches the head
  (:mod:`~dagster_slurm.session.supervision.head_watch`). ``background=False`` starts
  neither (tests drive :meth:`RunSession.beat` themselves).
* **Teardown.** :meth:`RunSession.close` with ``cancel=True`` cancels every job carrying
  the session's job name (current allocation, a successor pending or running, anything
  pending) and marks the session closed, after which no process submits for it again. A
  ``close()`` never waits for a head that is still pending in another thread: that wait
  ends with :class:`~dagster_slurm.session.core.errors.SessionError`.
* **Extension points.** A subclass keeps its own state on the one session object, across
  submissions, promotions and attachments; it can override :meth:`RunSession.make_allocation`
  (every allocation object is made there) and :meth:`RunSession.clone_allocation_config`
  (a successor's configuration derived from the current allocation's).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dagster_slurm.errors import ConfigurationError, DagsterSlurmError
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.jobs.pending import DEFAULT_FATAL_REASONS, PendingPolicy
from dagster_slurm.jobs.signals import drain_signal_of
from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.session.core.allocation import SlurmAllocation
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.context import SessionContext
from dagster_slurm.session.core.errors import (
    REQUEUED,
    SlurmAllocationEnded,
    SlurmStepExecutionResult,
)
from dagster_slurm.session.core.heartbeat import SessionThreads
from dagster_slurm.session.core.io import AgentSessionIO, SessionIO
from dagster_slurm.session.core.paths import SessionPaths, session_digest, session_job_name
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.head.acquire import acquire_head, new_allocation
from dagster_slurm.session.head.election import replace_head
from dagster_slurm.session.head.layout import RunLayout, head_request
from dagster_slurm.session.head.successor import (
    SuccessorAllocation,
    inherit_config,
    promote_successor,
    submit_successor,
)
from dagster_slurm.session.scaling.estimates import (
    WorkerStartEstimate,
    WorkerStartEstimator,
    estimate_worker_starts,
    worker_sbatch_options,
)
from dagster_slurm.session.scaling.intents import ReconcileResult, WorkerIntent
from dagster_slurm.session.scaling.reconcile import assign_worker_intent, inspect, reconcile_workers
from dagster_slurm.session.scaling.snapshot import SessionSnapshot
from dagster_slurm.session.supervision.head_watch import HeadWatch
from dagster_slurm.session.workers.keep import keep_a_worker
from dagster_slurm.session.workers.removal import (
    release_at_close,
    remove_worker_allocation,
    worker_allocations,
)
from dagster_slurm.session.workers.submit import (
    WorkerAllocation,
    add_worker_allocation,
    wait_for_worker_allocation,
)
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import new_session_document

__all__ = ["RunSession", "session_digest"]


class RunSession:
    """The run's shared allocation as used by this process; see the module docstring.

    ``activation`` returns the environment's activation script on the cluster (prepared on
    first use); ``environment`` describes the environment settings (JSON-able; part of the
    session's digest, so resources with other environments get other sessions).

    The cluster is reached through ``io`` (a :class:`~dagster_slurm.session.core.io.SessionIO`;
    None: the agent of ``slurm``), waits use ``clock`` (monotonic seconds) and ``sleep``;
    unit tests inject an in-memory cluster and a fake clock. ``background`` False: no
    heartbeat or head-watch thread is started (beats happen when :meth:`beat` is called).

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
        background: bool = True,
    ) -> None:
        queue = head_request(config, slurm.queue, layout)  # checks the combination
        digest = session_digest(queue, config, launcher, environment, layout)
        paths = SessionPaths.create(slurm.base_path(), run_id, digest)
        job_name = session_job_name(run_id, digest)
        spec = queue.to_sbatch_spec(
            job_name, f"{paths.session_dir}/submit/allocation.sh",
            output=paths.output, error=paths.output, chdir=paths.session_dir,
            **config.sbatch_options())
        #: The session's collaborators and shared operations, as its features see them.
        self.context = SessionContext(
            slurm=slurm, run_id=run_id, config=config, launcher=launcher,
            head_launcher=launcher if layout is None else layout.head_launcher(launcher),
            layout=layout, queue=queue, spec=spec, digest=digest, paths=paths,
            job_name=job_name,
            drain_signal=drain_signal_of(queue.signal_before_timeout) or "TERM",
            activation=activation, pending=pending or PendingPolicy(DEFAULT_FATAL_REASONS),
            poll_interval=poll_interval,
            io=io or AgentSessionIO(slurm, paths, new_session_document(job_name, run_id)),
            clock=clock, sleep=sleep, follow=follow, ensure=self.ensure,
            make_allocation=self.make_allocation,
            clone_allocation_config=self.clone_allocation_config,
        )
        #: True once a step of this process was interrupted (not an ordinary exception).
        self.interrupted = False
        self._threads = SessionThreads(
            job_name, self.beat, config.heartbeat_interval, background=background,
            watch=(lambda: HeadWatch(self.context)) if self.context.has_ray else None)

    # -- what the session is (read from the context) ----------------------------------------
    slurm = property(lambda self: self.context.slurm, doc="The cluster's ``SlurmResource``.")
    run_id = property(lambda self: self.context.run_id, doc="The Dagster run id.")
    config = property(lambda self: self.context.config, doc="The head allocation's configuration.")
    launcher = property(lambda self: self.context.launcher, doc="The session's launcher.")
    head_launcher = property(lambda self: self.context.head_launcher,
                             doc="The launcher that renders the head allocation's script.")
    layout = property(lambda self: self.context.layout,
                      doc="The run's layout over head and worker allocations (None: one).")
    activation = property(lambda self: self.context.activation,
                          doc="Returns the environment's activation script on the cluster.")
    pending = property(lambda self: self.context.pending, doc="The pending-reason policy.")
    poll_interval = property(lambda self: self.context.poll_interval,
                             doc="Seconds between polls of a step.")
    queue = property(lambda self: self.context.queue, doc="The head allocation's request.")
    digest = property(lambda self: self.context.digest, doc="The session's 8-digit digest.")
    paths = property(lambda self: self.context.paths, doc="Where the session's files are.")
    job_name = property(lambda self: self.context.job_name, doc="The Slurm job name of every job.")
    spec = property(lambda self: self.context.spec, doc="The head allocation's sbatch request.")
    drain_signal = property(lambda self: self.context.drain_signal,
                            doc="The signal that drains the head's steps.")
    io = property(lambda self: self.context.io, doc="The session's cluster I/O.")
    clock = property(lambda self: self.context.clock, doc="Monotonic seconds.")
    sleep = property(lambda self: self.context.sleep, doc="The session's sleep.")
    follow = property(lambda self: self.context.follow, doc="The run follower (None: none).")
    store = property(lambda self: self.context.store, doc="The session document's store.")
    has_ray = property(lambda self: self.context.has_ray,
                       doc="True when the allocation starts a Ray cluster.")
    separate_head = property(lambda self: self.context.separate_head,
                             doc="True when the run is laid out over head and worker allocations.")

    @property
    def publish_allocation(self) -> Callable[[str], None] | None:
        """Called with the job id of a newly promoted allocation to publish the run tag
        ``dagster-slurm/allocation`` (None: no Dagster run to tag)."""
        return self.context.publish_allocation

    @publish_allocation.setter
    def publish_allocation(self, value: Callable[[str], None] | None) -> None:
        self.context.publish_allocation = value

    def initial_document(self) -> dict[str, Any]:
        """The document the session's first write creates."""
        return self.context.initial_document()

    # -- the allocation --------------------------------------------------------------------
    @property
    def allocation(self) -> SlurmAllocation:
        """:meth:`ensure` (it may submit the allocation and wait for it); the name of
        dagster-slurm 1.x."""
        return self.ensure()

    def ensure(self, logger: Any = None) -> SlurmAllocation:
        """The allocation the run's steps use now: this process's current one, else the one
        the session document names (attached to), else a new submission. Waits until it
        accepts steps, logging the scheduler's pending reason and start estimate, without
        holding a lock (:meth:`close` from another thread ends the wait). With a
        :attr:`layout`, a process that gets the head ready this way then submits the first
        worker allocation again when the session has no live one
        (:func:`~dagster_slurm.session.workers.keep.keep_a_worker`)."""
        current = self.context.current
        self._begin_use()
        allocation = current.current()
        if allocation is not None:
            return allocation
        allocation = acquire_head(self.context, ProgressLog(logger))
        # once per process and head allocation: a session laid out with worker
        # allocations submits one when it has none left (see workers/keep.py)
        keep_a_worker(self.context, logger)
        return current.install(allocation)

    def current_allocation(self) -> SlurmAllocation | None:
        """The allocation this process's steps use now, without waiting or submitting
        (None before the first step needs one, or after it ended)."""
        return self.context.current.current()

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
        :class:`~dagster_slurm.session.core.errors.SlurmAllocationEnded` and is replaced for
        the next step."""
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ConfigurationError("command", command, "must name a program to run")
        allocation = self.ensure(logger)
        try:
            return allocation.execute(argv, name=name, env=env, activation=self.activation(),
                                      raise_on_error=raise_on_error,
                                      on_poll=self.step_follow(name))
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
        (None: no limit); :class:`~dagster_slurm.session.head.election.HeadElectionTimeout`
        once it passed. See :mod:`dagster_slurm.session.head.election`."""
        self._begin_use()
        return replace_head(self.context, timeout, logger)

    def submit_successor(self, config: SlurmRunAllocationConfig | None = None, *,
                         logger: Any = None) -> SuccessorAllocation:
        """Queue a successor of the current allocation and return once sbatch answered.

        Fields of ``config`` left unset take the current allocation's values, except
        ``extra_sbatch_directives`` (this submission's only; empty unless given). Raises
        :class:`SessionError` naming the outstanding successor when one is outstanding. The
        successor carries the session's job name: teardown cancels it, pending or running.
        """
        self._begin_use()
        return submit_successor(self.context, config or SlurmRunAllocationConfig(), logger)

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
        self._begin_use()
        return promote_successor(self.context, launcher, activation_script, logger, wait)

    # -- scaling hooks (session/scaling/) ---------------------------------------------
    def inspect(self) -> SessionSnapshot:
        """One observation of every allocation of the session (head, published successor,
        worker allocations): scheduler facts, Ray membership, drain state and the
        bookkeeping of :meth:`reconcile_workers`, in one round trip and one scheduler query;
        waits for nothing. Values that could not be observed are None; when the scheduler
        did not answer every state is None and ``certain`` is False."""
        return inspect(self.context)

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
        :class:`~dagster_slurm.session.scaling.intents.ReconcileResult`."""
        self._begin_use()
        return reconcile_workers(self.context, intent, observed, release, max_submissions,
                                 max_observation_age, logger)

    def assign_worker_intent(self, job_id: str, key: str | None) -> None:
        """Move the live worker allocation ``job_id`` into the intent ``key`` (counted and
        released by it from now on), or with None out of every intent (scale-in never
        releases it), under the session lock. An allocation being released keeps its intent
        until it ends (SessionError)."""

        assign_worker_intent(self.context, job_id, key)

    # -- worker allocations (session/workers/) ----------------
    def add_worker_allocation(self, config: SlurmWorkerAllocationConfig,
                              logger: Any = None) -> WorkerAllocation:
        """Submit a worker allocation (a ``SlurmWorkerAllocationConfig``) whose nodes join
        the run's Ray cluster; returns its ``WorkerAllocation`` once sbatch answered."""
        self._begin_use()
        return add_worker_allocation(self.context, config, logger)

    def wait_for_worker_allocation(self, allocation: WorkerAllocation, timeout: float | None = None,
                                   logger: Any = None) -> list[str]:
        """Block until every node of ``allocation`` joined the run's Ray head (starting the
        head first if needed); their Ray node ids. Raises ``SessionError`` when the job
        ends first, ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
        self._begin_use()
        return wait_for_worker_allocation(self.context, allocation, timeout, logger)

    def remove_worker_allocation(self, allocation: WorkerAllocation | str,
                                 drain_timeout: float = 600.0, wait: bool = True,
                                 logger: Any = None) -> JobState | None:
        """Remove a worker allocation (a handle of :meth:`list_worker_allocations`, or
        its job id) from the run's Ray cluster: one that has not started is cancelled; a running one
        is drained through Ray (running tasks and actors go on, each node leaves once idle,
        what still runs ``drain_timeout`` seconds from now is stopped). Returns the job's
        final Slurm state, normally COMPLETED (CANCELLED for one that had not started);
        with ``wait=False`` None at once, the follow-up running in a daemon thread. Never
        signals the head allocation or the payload drivers."""
        self._begin_use()
        return remove_worker_allocation(self.context, allocation, drain_timeout, wait, logger)

    def list_worker_allocations(self) -> list[WorkerAllocation]:
        """The session's live (not released) worker allocations, as the session document
        records them (one read of it on the cluster; a restarted supervisor finds them here,
        to remove them)."""
        return worker_allocations(self.context)

    @property
    def worker_allocations(self) -> list[WorkerAllocation]:
        """:meth:`list_worker_allocations` (it reads the cluster on every access)."""
        return self.list_worker_allocations()

    # -- start estimates (session/scaling/) --------------------------------------------
    def worker_sbatch_options(self, candidates: Sequence[SlurmWorkerAllocationConfig]
                              ) -> list[list[str]]:
        """For each candidate (a ``SlurmWorkerAllocationConfig``), the sbatch options
        :meth:`add_worker_allocation` would submit now: inherited fields resolved, without
        the batch script's path and the per-submission ``--comment`` token. One read of the
        session document; nothing is submitted."""
        return worker_sbatch_options(self.context, candidates)

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
        return estimate_worker_starts(self.context, candidates, estimator)

    # -- extension points ------------------------------------------------------------------
    def make_allocation(self, job_id: str, nodes: tuple[str, ...], values: Mapping[str, Any],
                        config: Mapping[str, Any] | None = None) -> SlurmAllocation:
        """The allocation object of ``job_id`` (its ready file's ``values``); its drain
        signal is the one of ``config`` (the allocation's recorded configuration; None or
        empty: the session's).

        Extension point: every allocation object the session hands out is made here, for
        the allocation it submitted, one it attaches to (another process's, or after a
        restart), a promoted successor and a worker allocation that hosts the head. A
        subclass returns a subclass of :class:`SlurmAllocation` (site-specific steps, its
        own Ray start, extra facts); it has the session (``self``: configuration, ``slurm``
        and its SSH connection, launcher, ``follow``) to pass on. ``nodes``: the
        allocation's hosts, head first; ``values``: its step server's ready file (``head``,
        ``ray_address``)."""
        return new_allocation(self.context, job_id, nodes, values, config)

    def clone_allocation_config(self, current: Mapping[str, Any],
                                given: SlurmRunAllocationConfig) -> SlurmRunAllocationConfig:
        """The configuration a successor is submitted with: ``given`` (what the caller
        passed to :meth:`submit_successor`) completed by ``current`` (the recorded
        configuration of the allocation it follows, a JSON-able mapping).

        The default fills every field the caller left unset from ``current``, except
        ``extra_sbatch_directives`` (see
        :func:`~dagster_slurm.session.head.successor.inherit_config`). Extension point: a
        subclass overrides it to carry over operational dependencies the default does not
        repeat (a license or reservation directive, fields of a
        :class:`SlurmRunAllocationConfig` subclass) or to refuse a successor. The result
        is validated like any configuration, recorded with the successor and returned as
        its ``config``; raise :class:`~dagster_slurm.errors.ConfigurationError` naming the
        field to refuse."""
        return inherit_config(current, given)

    # -- steps, heartbeat and teardown -----------------------------------------------------
    def _begin_use(self) -> None:
        self.context.current.begin_use()
        if not self.context.current.closed:
            self._threads.start()

    def step_follow(self, step: str) -> Callable[[], None]:
        """The ``on_poll`` of a wait on ``step``: calls :attr:`follow` (nothing without one)."""
        return self.context.step_follow(step)

    def forget(self, allocation: SlurmAllocation, state: str | None = None) -> None:
        """Stop using ``allocation`` (it ended); the next step gets a new one. One that
        Slurm requeued (``state`` ``REQUEUED``) is cancelled: a restart would not serve."""
        self.context.current.drop(allocation)
        self.context.retire(allocation.job_id, "job_id", state)
        if state == REQUEUED:
            self.context.cancel_quietly(allocation.job_id, ProgressLog(None))

    def cleanup_step(self, step_key: str) -> None:
        """Remove the invocation files ``step_key`` kept (``defer_cleanup=True``) in every
        allocation the session has had; submits nothing."""
        self.context.remove_step_files(step_key)

    def beat(self) -> None:
        """One heartbeat: ``/heartbeat`` in the document and new content in the heartbeat
        file (the step server's dead-man's switch watches the content, not the mtime)."""
        self.context.beat()

    def close(self, *, cancel: bool, reason: str = "", logger: Any = None) -> None:
        """Stop the heartbeat; with ``cancel``, cancel every job of the session's name and
        mark the session closed (also when this process never used the allocation)."""
        self.context.current.close()
        self._threads.stop()
        if cancel:
            self.cancel_all(reason, logger)

    def cancel_all(self, reason: str = "", logger: Any = None) -> None:
        """``scancel --name=<session job name>`` and mark the session closed."""
        out = ProgressLog(logger)
        try:
            self.io.cancel(job_name=self.job_name)
            if not self.context.current.used:
                return  # this process never touched the session: leave no document behind
            change = tr.close_session(None, reason=reason or "teardown")
            assert isinstance(change, tr.Change)
            self.io.apply(change)
            release_at_close(self.context)
            out.info(f"Cancelled the run allocation(s) of {self.job_name}"
                     + (f" ({reason})" if reason else ""))
        except DagsterSlurmError as exc:
            out.error(f"could not cancel the run allocation(s) of {self.job_name}: {exc}; "
                      f"cancel them with `scancel --name={self.job_name}`")
