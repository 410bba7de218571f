"""Keeping a worker allocation for a run laid out over a head and worker allocations.

Keeping a worker (:func:`keep_a_worker`): whenever a process has the session's head ready
(:meth:`RunSession.ensure` attached to it or started it: once per process and head
allocation, not on every step), it reads the session document and one squeue of the
session's job name, and when the session has no live worker allocation and none being
submitted (:func:`~dagster_slurm.state.election.needs_worker`), it submits the first worker
allocation again. A retried run (a new process, the same session) whose workers ended
therefore gets a new one. Processes that attach at the same moment agree through a short
lease in the session document (:data:`WORKER_LEASE`): one of them submits, the others see
its submission. An unknown (squeue failed, the document could not be read) never submits.

The submission is fenced by that lease (:class:`~dagster_slurm.session.core.submission.Fence`):
a process that stalled past the lease, while another took it over, queues nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.session.core.context import SessionContext
from dagster_slurm.session.core.submission import Fence
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.head.layout import RunLayout
from dagster_slurm.session.workers.settle import settle_stale_submissions
from dagster_slurm.session.workers.submit import add_worker_allocation
from dagster_slurm.state import lease
from dagster_slurm.state.election import SchedulerView, needs_worker
from dagster_slurm.state.schema import SessionDocument

log = logging.getLogger("dagster_slurm.session")

#: Name of the lease (``/leases/<name>`` in the session document) held while one process
#: decides on, and submits, the session's next worker allocation.
WORKER_LEASE = "worker-submission"

#: Seconds that lease lasts: enough for one sbatch round trip; a holder that died blocks
#: the next submission for at most this long.
WORKER_LEASE_TTL = 120.0

Submit = Callable[[SessionContext, SlurmWorkerAllocationConfig, Any], Any]


def submit_worker_allocation(session: SessionContext, config: SlurmWorkerAllocationConfig,
                             logger: Any = None, fence: Fence | None = None) -> Any:
    """Submit worker allocation ``config`` for ``session`` (returns at submission) through
    :func:`dagster_slurm.session.workers.submit.add_worker_allocation`, fenced by the
    lease ``fence`` (the submission applies only while it is held)."""
    return add_worker_allocation(session, config, logger, fence=fence)


def _scheduler_view(session: SessionContext) -> tuple[SessionDocument | None, SchedulerView]:
    """The session document and one squeue of the session's job name, as a view; stale
    open worker submissions (a submitter that vanished) are settled first, so that they
    do not count as workers on their way forever
    (:mod:`dagster_slurm.session.workers.settle`)."""
    read = session.io.read()
    snapshot = session.io.queue([session.job_name])
    if settle_stale_submissions(session, read.doc, read.now, snapshot):
        read = session.io.read()
    observed = snapshot.observed_at if snapshot.observed_at is not None else read.now
    return read.doc, SchedulerView.from_squeue(snapshot.queue, observed_at=observed,
                                               certain=snapshot.certain)


def keep_a_worker(session: SessionContext, logger: Any = None, *,
                  submit: Submit | None = None,
                  observed: tuple[SessionDocument | None, SchedulerView] | None = None) -> bool:
    """Submit the session's first worker allocation again when the session has no live
    worker allocation and none is being submitted; see the module docstring. True when
    this process submitted one. Does nothing for a session without a :class:`RunLayout`.
    ``submit`` (None: :func:`submit_worker_allocation`, fenced by the lease) submits it and
    returns at submission. ``observed``: the document and scheduler view the caller just read (the
    head watch's), used for the first look instead of reading them again.

    A document or squeue that cannot be read, or another process holding
    :data:`WORKER_LEASE`, submits nothing (logged); an error of the submission itself (sbatch
    refused the job) propagates."""
    layout: RunLayout | None = session.layout
    if layout is None:
        return False
    out = ProgressLog(logger)
    try:
        if observed is not None and observed[0] is not None and any(
                record.status in ("submitting", "unknown")
                for record in observed[0].worker_submissions.values()):
            observed = None  # an open submission may be stale: look (and settle) afresh
        doc, view = observed if observed is not None else _scheduler_view(session)
        if not needs_worker(doc, view):
            return False
        owner = lease.new_owner_id()
        grant = lease.acquire(session.store, WORKER_LEASE, owner, WORKER_LEASE_TTL,
                              monotonic=session.clock)
    except DagsterSlurmError as exc:
        out.warning(f"Could not check the worker allocations of {session.job_name}: {exc}; "
                    "none submitted now")
        return False
    if not grant.acquired:
        holder = grant.holder.owner if grant.holder is not None else "another process"
        out.info(f"{holder} submits the session's worker allocation")
        return False
    try:
        try:
            doc, view = _scheduler_view(session)  # another process may have submitted meanwhile
        except DagsterSlurmError as exc:
            out.warning(f"Could not check the worker allocations of {session.job_name}: "
                        f"{exc}; none submitted now")
            return False
        if not needs_worker(doc, view) or not grant.still_valid(session.clock):
            return False
        config = layout.first_worker
        out.info(
            f"The run has no live worker allocation: submitting one (partition "
            f"{config.partition or 'default'}, {config.num_nodes or 1} node(s), time limit "
            f"{config.time_limit})"
        )
        if submit is None:  # fenced: a holder that stalled past its lease submits nothing
            submit_worker_allocation(session, config, logger, fence=Fence(WORKER_LEASE, owner))
        else:
            submit(session, config, logger)
        return True
    finally:
        try:
            lease.release(session.store, WORKER_LEASE, owner)
        except DagsterSlurmError as exc:
            log.warning("could not release the lease %s: %s (it expires in %.0f s)",
                        WORKER_LEASE, exc, WORKER_LEASE_TTL)
