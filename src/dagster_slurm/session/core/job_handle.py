"""The handle of a Slurm job a run session submitted besides its head: a queued successor
(:class:`~dagster_slurm.session.head.successor.SuccessorAllocation`) or a worker allocation
(:class:`~dagster_slurm.session.workers.submit.WorkerAllocation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster_slurm.slurm.states import JobState

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext


class SessionJob:
    """A job of ``session``: ``job_id`` (also ``slurm_job_id``) and the ``token`` of its
    submission (the job carries it in ``--comment``)."""

    def __init__(self, session: SessionContext, job_id: str, token: str) -> None:
        self._session = session
        self.job_id = job_id
        self.token = token

    @property
    def slurm_job_id(self) -> str:
        """The Slurm job id (the same value as :attr:`job_id`)."""
        return self.job_id

    def state(self) -> JobState | None:
        """The job's scheduler state now (None when the scheduler does not say)."""
        return self._session.io.queue([self._session.job_name]).job(self.job_id).state
