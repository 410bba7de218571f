"""The one guarded submission of a run session: heads, successors and worker allocations.

Every job a session submits goes the same way:

1. a fresh **token** (the job's ``--comment``) and the feature's **transition** of the
   session document, decided on the document the caller read (a refusal raises
   :class:`~dagster_slurm.session.core.errors.SessionError` with the transition's reason);
2. the **guards** that must still hold under the lock when the agent records the
   submission and again when it records the job id: the transition's own (the session is
   open, the predecessor is still the head, ...) plus a **lease fence** where the caller
   holds a lease (:func:`~dagster_slurm.state.lease.fence_patch`): a caller that stalled
   past its lease submits nothing;
3. the agent's ``submit`` (record if absent, sbatch, record the job id: one round trip);
4. one of four outcomes: **submitted** (:class:`SubmitResult` with the job; ``recovered``
   when the token's job already existed), **in doubt** (another record holds the pointer:
   read the document again), **guard failed** (nothing submitted, or the job queued
   meanwhile was cancelled: :meth:`SubmitGuardFailed.outcome` says which), or a
   **scheduler error** (raised as
   :class:`~dagster_slurm.jobs.errors.SlurmSubmissionError`). An interruption (any other
   exception, ``KeyboardInterrupt``, a run that ended) cancels the job by its token and is
   raised again, so no job is left without a record.

A refusal for a limit on queued jobs (``MaxSubmitJobs``, ...) is none of these: the
submission waits for a free slot, logging the limit, and submits again (see
:mod:`dagster_slurm.scheduler.submit_wait`); the run ending stops the wait.

:func:`submit_request` builds the request (also the step of a batched submission, for
``reconcile_workers``, whose batch goes to the agent in one round trip with the other steps
of its plan); :func:`guarded_submit` runs one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster_slurm.agent.exceptions import SubmissionInDoubt, SubmitGuardFailed
from dagster_slurm.errors import SchedulerError
from dagster_slurm.jobs.errors import SlurmSubmissionError
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.scheduler.client import SubmittedJob
from dagster_slurm.session.core.batch_io import Files, Submit
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.state import lease
from dagster_slurm.state import transitions as tr

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext


class SubmitOutcome(str, enum.Enum):
    """How a guarded submission ended (a scheduler error raises instead)."""

    #: sbatch queued the job and its id is recorded (``job``).
    SUBMITTED = "submitted"
    #: Another record holds the pointer (another process submits): read the document again.
    IN_DOUBT = "in_doubt"
    #: A guard did not hold under the lock (``failure`` says what became of the job).
    GUARD_FAILED = "guard_failed"


@dataclass(frozen=True)
class SubmitResult:
    """The outcome of :func:`guarded_submit`: ``job`` when SUBMITTED, ``failure`` when
    GUARD_FAILED, neither when IN_DOUBT."""

    outcome: SubmitOutcome
    job: SubmittedJob | None = None
    failure: SubmitGuardFailed | None = None


@dataclass(frozen=True)
class Fence:
    """A lease the submitter holds: the submission applies only while ``owner`` holds
    lease ``name``."""

    name: str
    owner: str


def refuse(decided: tr.Outcome | None) -> None:
    """Raise :class:`SessionError` with the reason when the transition was refused."""
    if isinstance(decided, tr.Refused):
        raise SessionError(decided.reason)


def submit_request(
    session: SessionContext,
    decided: tr.Outcome | None,
    *,
    spec: SbatchSpec,
    files: Files,
    token: str,
    record_value: Mapping[str, Any],
    record: str = "/allocation",
    guards: Sequence[Mapping[str, Any]] = tr.SUBMIT_GUARDS,
    on_submitted: tuple[str, Mapping[str, Any]] | None = None,
    fence: Fence | None = None,
) -> Submit:
    """The submission request of ``token``: raises :class:`SessionError` with the reason
    when the transition ``decided`` was refused (None: the caller's plan decided it, as
    ``reconcile_workers``' planner does); ``guards`` extended by ``fence``."""
    refuse(decided)
    fenced = () if fence is None else tuple(lease.fence_patch(fence.name, fence.owner))
    return Submit(spec=spec, files=files, token=token, record=record,
                  record_value=record_value, on_submitted=on_submitted,
                  guards=(*guards, *fenced), create=session.initial_document())


def guarded_submit(session: SessionContext, request: Submit, what: str,
                   out: ProgressLog) -> SubmitResult:
    """Run ``request`` (see the module docstring). ``what`` names the job in the error of
    a scheduler that refused it (``"the successor allocation"``; an empty ``what`` gives
    the scheduler's words alone)."""
    follow = session.follow
    waits = session.slurm.limit_wait(
        out.info, None if follow is None else lambda: follow(f"a free slot to submit {what}"))
    try:
        job = session.io.submit(
            request.spec, files=request.files, token=request.token,
            record_value=request.record_value, create=request.create, record=request.record,
            guards=request.guards, on_submitted=request.on_submitted, limit_wait=waits)
    except SubmissionInDoubt:
        return SubmitResult(SubmitOutcome.IN_DOUBT)
    except SubmitGuardFailed as exc:
        return SubmitResult(SubmitOutcome.GUARD_FAILED, failure=exc)
    except SchedulerError as exc:
        message = f"{what} could not be submitted: {exc}" if what else str(exc)
        raise SlurmSubmissionError(message) from None
    except BaseException:
        session.cancel_by_token(request.token, out)  # an interrupted submission leaves no job
        raise
    return SubmitResult(SubmitOutcome.SUBMITTED, job=job)
