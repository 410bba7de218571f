"""Publishing the run tag ``dagster-slurm/allocation`` after a promotion, without going back.

The tag names the allocation the run's steps use now. Two writers set it: every step, for
the allocation it is about to run in (the session runner, through
:func:`publish_run_tag`), and a promotion, for the allocation
it promoted; a repeated promotion publishes again (its repair). The tag is not a
compare-and-swap, so a promotion repeated late (by a process that read the session before a
newer successor was promoted, whose steps already tagged the run with it) must not set it
back. :func:`publish_promoted` publishes only the session document's current allocation:
it leaves the tag alone when a later allocation is current, and after writing it reads the
document again, publishing the current allocation once more should it have changed between
the read and the write (a step of that allocation tagged the run in that moment).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.contexts import run_id_of
from dagster_slurm.jobs.logs import ProgressLog

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext

log = logging.getLogger("dagster_slurm.session")

#: The run tag naming the allocation the run's steps use now.
ALLOCATION_TAG = "dagster-slurm/allocation"


def current_allocation(session: SessionContext) -> str | None:
    """The job id of the session's current allocation in its document; None when there is
    none (or it has no job id yet). Raises what reading the document raises."""
    doc = session.io.read().doc
    head = None if doc is None else doc.allocation
    return None if head is None or not head.job_id else str(head.job_id)


def publish_promoted(session: SessionContext, job_id: str, out: ProgressLog) -> None:
    """Publish ``job_id`` as the run's allocation (``session.publish_allocation``; nothing
    when that is None) unless the document names another current allocation; see the module
    docstring. Best effort: a document that cannot be read leaves the tag as it is (logged;
    promote_successor() repeats the publication)."""
    publish = session.publish_allocation
    if publish is None:
        return
    try:
        current = current_allocation(session)
        if current is not None and current != job_id:
            out.info(f"The run tag is left at the session's current allocation {current}, "
                     f"not set back to {job_id}")
            return
        publish(job_id)
        after = current_allocation(session)
        if after is not None and after != job_id:
            publish(after)  # a newer allocation was published meanwhile; its steps use it
    except DagsterSlurmError as exc:
        out.warning(f"the run tag of allocation {job_id} was not published ({exc}); call "
                    "promote_successor() again")


def publish_run_tag(context: Any, job_id: str) -> None:
    """Set the run tag ``dagster-slurm/allocation`` of the context's run to ``job_id``
    (best effort: logged, never raised; tags are for operators and sensors)."""
    try:
        instance, run_id = context.instance, run_id_of(context)
        run = instance.get_run_by_id(run_id)
        if run is not None and run.tags.get(ALLOCATION_TAG) != job_id:
            instance.add_run_tags(run_id, {ALLOCATION_TAG: job_id})
    except Exception as exc:  # noqa: BLE001 - informational only: logged, not raised
        log.warning("run tag %s=%s not written (%s: %s)", ALLOCATION_TAG, job_id,
                    type(exc).__name__, exc)
