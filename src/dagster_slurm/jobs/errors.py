"""Typed failures of a job (asset-scope job, local process, or a step of a run allocation);
each one says what happened and what to look at.

Job failures derive from :class:`SlurmJobError`; a submission sbatch refused is
:class:`SlurmSubmissionError`. Both are :class:`~dagster_slurm.errors.DagsterSlurmError`, so an
asset can catch one kind (``except SlurmJobTimeout``) or all of them. A failed job's files are
kept in its job directory for debugging; a successful one's are removed unless
``defer_cleanup`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_slurm.errors import DagsterSlurmError


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended, as far as it could be observed.

    ``job_id`` is the Slurm job id (``local-<pid>`` in local mode); ``state`` the final
    scheduler state name (None when unknown); ``exit_code`` the payload's exit code (None when
    it never wrote one); ``stdout_tail``/``stderr_tail`` the last lines of its output;
    ``reason`` the scheduler's reason code (None when it gave none); ``nodes`` the hosts the
    job ran on, as far as known (``()`` when it never ran or they are unknown).
    """

    job_id: str
    state: str | None
    exit_code: int | None
    stdout_tail: str = ""
    stderr_tail: str = ""
    reason: str | None = None
    nodes: tuple[str, ...] = ()


class SlurmJobError(DagsterSlurmError):
    """Base class: a job did not complete successfully. ``outcome`` holds the details."""

    headline = "job failed"

    def __init__(self, outcome: JobOutcome, detail: str = "") -> None:
        self.outcome = outcome
        parts = [f"{self.headline} (job {outcome.job_id}, state {outcome.state or 'unknown'}"
                 + (f", exit code {outcome.exit_code}" if outcome.exit_code is not None else "")
                 + (f", on {','.join(outcome.nodes)}" if outcome.nodes else "")
                 + ")"]
        if detail:
            parts.append(detail)
        if outcome.stderr_tail.strip():
            parts.append("stderr (last lines):\n" + outcome.stderr_tail.rstrip())
        if outcome.stdout_tail.strip():
            parts.append("stdout (last lines):\n" + outcome.stdout_tail.rstrip())
        super().__init__("\n".join(parts))


class SlurmJobNonZeroExit(SlurmJobError):
    """The payload ran and exited with a non-zero code."""

    headline = "payload exited with a non-zero code"


class SlurmJobTimeout(SlurmJobError):
    """The job reached its walltime (state TIMEOUT)."""

    headline = "job reached its time limit"


class SlurmJobOutOfMemory(SlurmJobError):
    """The job exceeded its memory (state OUT_OF_MEMORY)."""

    headline = "job ran out of memory"


class SlurmNodeFailure(SlurmJobError):
    """A node of the job failed (NODE_FAIL, BOOT_FAIL)."""

    headline = "a node of the job failed"


class SlurmJobRequeued(SlurmJobError):
    """Slurm started the job again (a requeue: node failure, preemption, ``scontrol
    requeue``) although it was submitted without requeue, and the job script did not start
    the payload a second time."""

    headline = "Slurm restarted the job; the payload was not started again"


class SlurmJobCancelled(SlurmJobError):
    """The job was cancelled by someone or something other than this library."""

    headline = "job was cancelled outside this run"


class SlurmJobPreempted(SlurmJobError):
    """The job was preempted (PREEMPTED) or its deadline passed (DEADLINE)."""

    headline = "job was preempted"


class SlurmJobUnschedulable(SlurmJobError):
    """The job waited for a reason that means it can never start as submitted."""

    headline = "job can never start as submitted"


class SlurmJobLost(SlurmJobError):
    """The job left the queue and nothing (status file, accounting) says how it ended."""

    headline = "job vanished from the scheduler"


class SlurmSubmissionError(DagsterSlurmError):
    """sbatch rejected the job; the message carries Slurm's own words."""
