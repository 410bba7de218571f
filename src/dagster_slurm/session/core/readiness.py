"""Waiting until an allocation accepts steps.

:class:`ReadyWatch` polls one allocation (its step server's ready file, and squeue when
due, in one round trip) for the head path, which also uses it for a successor being
promoted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.jobs.pending import PendingTracker
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.session.core.allocation import parse_ready
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.slurm.states import JobState

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext

log = logging.getLogger("dagster_slurm.session")

#: What :meth:`ReadyWatch.poll` returns for an allocation that ended after accepting steps.
ENDED: Any = object()
#: States of an allocation that is ending (it starts no step, whatever its ready file says).
ENDING = frozenset({JobState.COMPLETING, JobState.STAGE_OUT})


class ReadyWatch:
    """One allocation being waited for: each :meth:`poll` is one round trip (the step
    server's ready file, with squeue when due)."""

    CHECK_INTERVAL = 2.0

    def __init__(self, session: SessionContext, job_id: str, out: ProgressLog) -> None:
        self.session = session
        self.job_id = job_id
        self.out = out
        self.tracker = PendingTracker(job_id, session.pending, out.info)
        self.running_since: float | None = None
        self.next_check = 0.0
        self.backoff = PollBackoff(initial=0.25, maximum=5.0, factor=1.5)
        self.delay = self.backoff.current

    def poll(self) -> dict[str, Any] | None:
        """The ready file's values once it exists; ``ENDED`` when the allocation ended
        after accepting steps (retired); None while waiting. Raises when it failed.

        While the allocation is pending every poll asks squeue (for its reason); once it
        runs, the ready file is read every poll and squeue every ``CHECK_INTERVAL`` seconds,
        and always before a ready file is trusted (it may be an ended allocation's; one of
        an allocation that is ending, COMPLETING, is waited out until its final state)."""
        session, job_id = self.session, self.job_id
        check = self.running_since is None or session.clock() >= self.next_check
        polled = session.io.poll_ready(session.job_name, job_id, with_status=check)
        if polled.status is None:
            if polled.ready is not None:
                self.next_check, self.delay = 0.0, 0.0
            return None
        self.next_check = session.clock() + self.CHECK_INTERVAL
        snapshot = polled.status
        observed = snapshot.job(job_id)
        state = snapshot.ended_state(job_id)
        ended = state is not None
        if polled.ready is not None:
            if ended:
                session.retire(job_id, "job_id", state)
                self.out.info(f"Run allocation {job_id} has ended ({state})")
                return ENDED
            if observed.state in ENDING:
                # its ready file is stale: it starts no step any more; wait for its end
                self.delay = self.backoff.observe(False)
                return None
            return parse_ready(polled.ready)
        if ended:
            tail = session.log_tail(job_id)
            session.retire(job_id, "job_id", state)
            raise SessionError(
                f"run allocation {job_id} ended ({state}) before it accepted steps; its "
                f"log {session.paths.output_of(job_id)} ends with:\n{tail}"
            )
        self.tracker(observed)
        if observed.state is not None and observed.state.active and not observed.state.pending:
            self.note_running()
        else:
            self.delay = self.backoff.observe(False)
        return None

    def note_running(self) -> None:
        session = self.session
        if self.running_since is None:
            self.running_since = session.clock()
            self.out.info(f"Run allocation {self.job_id} is running; waiting for it to accept "
                          f"steps{' (starting Ray)' if session.has_ray else ''}")
        if session.clock() - self.running_since > session.config.startup_timeout:
            raise SessionError(
                f"run allocation {self.job_id} did not accept steps within "
                f"{session.config.startup_timeout:g} s of starting (startup_timeout); its log "
                f"ends with:\n{session.log_tail(self.job_id)}"
            )
        self.delay = self.backoff.observe(True)
