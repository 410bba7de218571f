"""``SessionContext``: what every feature of a run session receives instead of ``RunSession``.

A feature (the head path, successors, elections, worker allocations, the scaling hooks, the
head watch) is a module of free functions taking one :class:`SessionContext`: the session's
configuration (``config``, ``queue``, ``spec``, ``launcher``, ``head_launcher``,
``layout``), where it lives (``paths``, ``job_name``), how it reaches the cluster (``io``
and its ``store`` and ``scheduler``), how it waits (``clock``, ``sleep``, ``follow``), the
current allocation (:class:`~dagster_slurm.session.core.current.CurrentAllocation`, its only
writer), and the operations several features share (:meth:`SessionContext.pause`,
:meth:`~SessionContext.retire`, :meth:`~SessionContext.cancel_quietly`,
:meth:`~SessionContext.cancel_by_token`, :meth:`~SessionContext.log_tail`).

Three operations belong to the front object and are passed in as callables, so that a
feature never imports :class:`~dagster_slurm.session.session.RunSession`:

* ``ensure``: the head ready for steps (``RunSession.ensure``: it starts the heartbeat and,
  for a laid-out run, keeps a worker allocation);
* ``make_allocation`` and ``clone_allocation_config``: the session's extension points (a
  subclass of ``RunSession`` overrides them; see there).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dagster_slurm.backoff import sleep_checking
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.cancel import cancel_by_token
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.jobs.paths import safe_name
from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.current import CurrentAllocation
from dagster_slurm.session.core.io import SessionIO
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import new_session_document
from dagster_slurm.state.store import StateStore

if TYPE_CHECKING:
    from dagster_slurm.jobs.pending import PendingPolicy
    from dagster_slurm.session.core.allocation import SlurmAllocation

log = logging.getLogger("dagster_slurm.session")

#: ``make_allocation(job_id, nodes, values, config)``: see ``RunSession.make_allocation``.
MakeAllocation = Callable[[str, tuple[str, ...], Mapping[str, Any], Mapping[str, Any] | None],
                          "SlurmAllocation"]


class SessionContext:
    """One run session's collaborators and shared operations, as features see them.

    Built once by :class:`~dagster_slurm.session.session.RunSession`; every attribute but
    ``publish_allocation`` is fixed for the session's lifetime."""

    def __init__(
        self,
        *,
        slurm: SlurmResource,
        run_id: str,
        config: SlurmRunAllocationConfig,
        launcher: ComputeLauncher,
        head_launcher: ComputeLauncher,
        layout: Any,
        queue: SlurmQueueConfig,
        spec: SbatchSpec,
        digest: str,
        paths: SessionPaths,
        job_name: str,
        drain_signal: str,
        activation: Callable[[], str | None],
        pending: PendingPolicy,
        poll_interval: float,
        io: SessionIO,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        follow: Callable[[str], None] | None,
        ensure: Callable[[Any], SlurmAllocation],
        make_allocation: MakeAllocation,
        clone_allocation_config: Callable[[Mapping[str, Any], SlurmRunAllocationConfig],
                                          SlurmRunAllocationConfig],
    ) -> None:
        self.slurm = slurm
        self.run_id = run_id
        self.config = config
        self.launcher = launcher
        #: The launcher that renders the head allocation's script (``launcher``, or a copy
        #: whose Ray node offers no CPUs or GPUs for a separate head).
        self.head_launcher = head_launcher
        #: The run's layout over a head and worker allocations
        #: (:class:`~dagster_slurm.session.head.layout.RunLayout`); None: one allocation.
        self.layout = layout
        self.queue = queue
        self.spec = spec
        self.digest = digest
        self.paths = paths
        self.job_name = job_name
        self.drain_signal = drain_signal
        self.activation = activation
        self.pending = pending
        self.poll_interval = poll_interval
        self.io = io
        self.clock = clock
        self.sleep = sleep
        self.follow = follow
        self.ensure = ensure
        self.make_allocation = make_allocation
        self.clone_allocation_config = clone_allocation_config
        #: The current allocation and the closed flag (their only writer).
        self.current = CurrentAllocation(job_name)
        #: Called with the job id of a newly promoted allocation to publish the run tag
        #: ``dagster-slurm/allocation`` (None: no Dagster run to tag).
        self.publish_allocation: Callable[[str], None] | None = None

    # -- facts -------------------------------------------------------------------------------
    @property
    def store(self) -> StateStore:
        """The session document's store (through ``io``)."""
        return self.io.store

    @property
    def scheduler(self) -> Any:
        """The scheduler client of ``io`` (None for an I/O without one)."""
        return self.io.scheduler

    @property
    def has_ray(self) -> bool:
        """True when the allocation starts a Ray cluster (its launcher is a RayLauncher)."""
        from dagster_slurm.launchers.ray import RayLauncher

        return isinstance(self.launcher, RayLauncher)

    @property
    def separate_head(self) -> bool:
        """True when the run's Ray cluster spans the head allocation and worker allocations
        from the start (a ``layout``): every step process then watches the head."""
        return self.layout is not None

    def initial_document(self) -> dict[str, Any]:
        """The document the session's first write creates."""
        return new_session_document(self.job_name, self.run_id)

    # -- shared operations -------------------------------------------------------------------
    def pause(self, seconds: float, waiting_for: str) -> None:
        """Sleep ``seconds`` between two polls, calling ``follow`` with ``waiting_for`` at
        least every second (it raises to end the wait once the Dagster run is over)."""
        follow = self.follow
        sleep_checking(self.sleep, seconds,
                       None if follow is None else (lambda: follow(waiting_for)), 1.0)

    def step_follow(self, step: str) -> Callable[[], None]:
        """The ``on_poll`` of a wait on ``step``: calls ``follow`` (nothing without one)."""
        follow = self.follow
        if follow is None:
            return lambda: None
        return lambda: follow(f"step {step} of the run allocation")

    def retire(self, value: Any, key: str, state: str | None) -> None:
        """Move the head record whose ``key`` (``job_id`` or ``token``) is ``value`` to the
        document's history with final ``state``; nothing when ``value`` is None or the
        record is no longer the head's."""
        if value is None:
            return
        for _attempt in range(5):
            decided = tr.retire(self.io.read().doc, key=key, value=str(value), final_state=state)
            if isinstance(decided, tr.Refused) or self.io.apply(decided).ok:
                return  # not (or no longer) the head record, or moved to history
        log.warning("could not retire allocation record %s=%s: it kept changing", key, value)

    def cancel_quietly(self, job_id: str, out: ProgressLog) -> None:
        """``scancel job_id``; a failure is logged with the command to run by hand."""
        try:
            self.io.cancel([job_id])
            out.warning(f"Cancelled run allocation {job_id}")
        except DagsterSlurmError as exc:
            out.error(f"could not cancel run allocation {job_id}: {exc}; run `scancel {job_id}`")

    def cancel_by_token(self, token: str, out: ProgressLog) -> None:
        """An interrupted submission: cancel the job carrying ``token``, if it exists."""
        scheduler = self.io.scheduler
        if scheduler is not None:
            cancel_by_token(scheduler, self.job_name, token, out)

    def log_tail(self, job_id: str, lines: int = 30) -> str:
        """The last ``lines`` of allocation ``job_id``'s output (a placeholder saying so
        when it is empty or unreadable)."""
        try:
            text = self.io.tail(self.paths.output_of(job_id), lines)
        except DagsterSlurmError as exc:
            return f"(unreadable: {exc})"
        return text.rstrip() or "(empty)"

    def beat(self) -> None:
        """One heartbeat: ``/heartbeat`` in the document and new content in the heartbeat
        file (the step server's dead-man's switch watches the content, not the mtime)."""
        host, pid = socket.gethostname(), os.getpid()
        change = tr.beat(None, host=host, pid=pid)
        assert isinstance(change, tr.Change)
        # new content every beat: the step server judges how long the content is unchanged
        self.io.beat(change, heartbeat_line())

    def remove_step_files(self, step_key: str) -> None:
        """Remove the invocation files ``step_key`` kept (``defer_cleanup=True``) in every
        allocation the session has had (one round trip); submits nothing."""
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

    def recorded_config(self, job_id: str) -> Mapping[str, Any] | None:
        """The configuration recorded with head allocation ``job_id`` (None: not known)."""
        try:
            doc = self.io.read().doc
        except DagsterSlurmError:
            return None
        record = doc.allocation if doc is not None else None
        return record.config if record is not None and record.job_id == job_id else None


def heartbeat_line() -> str:
    """One line of the heartbeat file: this host, pid and a fresh timestamp."""
    return f"{socket.gethostname()} {os.getpid()} {time.time_ns()}\n"
