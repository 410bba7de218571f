"""Worker submissions whose submitter vanished: found by their token, or marked lost.

A worker allocation's token is recorded (``/worker_submissions/<token>``, status
``submitting``) before sbatch runs, and the job carries it in ``--comment``. A submitter
that died between the two, or whose sbatch did not answer (``unknown``), leaves the record
open, and an open submission counts as a worker on its way
(:func:`~dagster_slurm.state.election.needs_worker`): nothing would be submitted again.
:func:`settle_stale_submissions` closes such records once they are older than
:data:`SUBMIT_GRACE_SECONDS`: a job in squeue carrying the token becomes the worker record
(``settle_worker_found``, so it is counted, listed and cancelled with the session); a
certain squeue without one marks the submission failed (``settle_worker_lost``). An
uncertain squeue settles nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dagster_slurm.protocol import SUBMIT_GRACE_SECONDS
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt
from dagster_slurm.state.schema import SessionDocument

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext

log = logging.getLogger("dagster_slurm.session")


def stale_tokens(doc: SessionDocument | None, now: float) -> list[str]:
    """Tokens of open worker submissions (``submitting`` or ``unknown``) older than
    :data:`SUBMIT_GRACE_SECONDS` at ``now`` (the store's clock)."""
    if doc is None:
        return []
    return sorted(token for token, record in doc.worker_submissions.items()
                  if record.status in ("submitting", "unknown")
                  and now - float(record.submitted_at or now) >= SUBMIT_GRACE_SECONDS)


def settle_stale_submissions(session: SessionContext, doc: SessionDocument | None, now: float,
                             snapshot: StatusSnapshot) -> int:
    """Settle the stale open worker submissions of ``doc`` against ``snapshot`` (one squeue
    of the session's job name); see the module docstring. The number settled."""
    tokens = stale_tokens(doc, now)
    if not tokens or not snapshot.certain:
        return 0
    carriers = {queued.comment: job_id for job_id, queued in snapshot.queue.items()
                if queued.comment}
    settled = 0
    for token in tokens:
        read = session.io.read()
        job_id = carriers.get(token)
        decided = (wt.settle_worker_found(read.doc, token=token, job_id=job_id)
                   if job_id is not None else wt.settle_worker_lost(read.doc, token=token))
        if isinstance(decided, tr.Refused) or not session.io.apply(decided).ok:
            continue  # settled meanwhile by another process
        settled += 1
        if job_id is not None:
            log.info("worker allocation %s of an interrupted submission found by its token",
                     job_id)
        else:
            log.warning("the worker submission %s of %s left no job (its submitter vanished "
                        "before sbatch answered); it is marked failed", token, session.job_name)
    return settled
