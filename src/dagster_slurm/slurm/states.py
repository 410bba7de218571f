"""Slurm job states as an enum, with the translation from scheduler text.

``squeue`` prints states in long form (``%T``: ``RUNNING``) or as compact codes
(``%t``: ``R``); ``sacct`` adds decorations such as ``CANCELLED by 1000`` or a trailing
``+`` when a column was truncated. :meth:`JobState.parse` accepts all of these and maps
anything else to :attr:`JobState.UNKNOWN`: it never raises and never guesses from a prefix.

Three groups are exported as frozensets:

* :data:`ACTIVE_STATES`: the job is queued or holds (or is about to hold) an allocation;
  polling should continue.
* :data:`TERMINAL_STATES`: the job has ended and will not change state again (for a
  requeued job Slurm reports a new state instead, such as ``REQUEUED``).
* :data:`FAILURE_STATES`: terminal states other than ``COMPLETED``.

``UNKNOWN`` belongs to none of them: the caller has to decide (for example by asking
``sacct`` when ``squeue`` no longer lists the job).
"""

from __future__ import annotations

import re
from enum import Enum


class JobState(str, Enum):
    """The state of a Slurm job, as reported by ``squeue`` or ``sacct``."""

    PENDING = "PENDING"
    """Waiting in the queue for resources (``PD``)."""
    RUNNING = "RUNNING"
    """Holds an allocation and runs (``R``)."""
    SUSPENDED = "SUSPENDED"
    """Allocation kept, execution suspended, CPUs released to other jobs (``S``)."""
    COMPLETING = "COMPLETING"
    """Ending; some processes may still be running on some nodes (``CG``)."""
    COMPLETED = "COMPLETED"
    """Ended with exit code 0 on all nodes (``CD``)."""
    CANCELLED = "CANCELLED"
    """Cancelled by a user or an administrator, before or after it started (``CA``)."""
    FAILED = "FAILED"
    """Ended with a non-zero exit code or another failure condition (``F``)."""
    TIMEOUT = "TIMEOUT"
    """Killed on reaching its time limit (``TO``)."""
    NODE_FAIL = "NODE_FAIL"
    """Ended because one or more of its nodes failed (``NF``)."""
    PREEMPTED = "PREEMPTED"
    """Ended by preemption (``PR``)."""
    BOOT_FAIL = "BOOT_FAIL"
    """Ended because its nodes could not be booted or launched (``BF``)."""
    DEADLINE = "DEADLINE"
    """Ended on reaching its ``--deadline`` (``DL``)."""
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    """Ended after running out of memory (``OOM``)."""
    CONFIGURING = "CONFIGURING"
    """Resources allocated, waiting for them to become ready, e.g. booting (``CF``)."""
    REQUEUED = "REQUEUED"
    """A completing job is being put back into the queue (``RQ``)."""
    REQUEUE_FED = "REQUEUE_FED"
    """Being requeued by a federation (``RF``)."""
    REQUEUE_HOLD = "REQUEUE_HOLD"
    """A held job is being requeued (``RH``)."""
    RESIZING = "RESIZING"
    """About to change size (``RS``)."""
    REVOKED = "REVOKED"
    """Federation sibling removed because another cluster started the job (``RV``)."""
    SIGNALING = "SIGNALING"
    """Being signalled (``SI``)."""
    SPECIAL_EXIT = "SPECIAL_EXIT"
    """Requeued into a special held state, usually by an epilog (``SE``)."""
    STAGE_OUT = "STAGE_OUT"
    """Staging out files after it ran (``SO``)."""
    STOPPED = "STOPPED"
    """Allocation and CPUs kept, execution stopped with SIGSTOP (``ST``)."""
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    """Held because its reservation was deleted (``RD``)."""
    UNKNOWN = "UNKNOWN"
    """The text could not be read as a Slurm state; not a Slurm state itself."""

    @classmethod
    def parse(cls, text: object) -> JobState:
        """Read a state from ``squeue``/``sacct`` text; anything unreadable is ``UNKNOWN``.

        Accepts long names (``RUNNING``), compact codes (``R``, ``PD``, ``OOM``),
        ``CANCELLED by <uid>`` and a single trailing ``+`` (truncated column), case-insensitively
        and with surrounding whitespace. Never raises.
        """
        if not isinstance(text, str):
            return cls.UNKNOWN
        token = text.strip().upper()
        match = _CANCELLED_BY.fullmatch(token)
        if match is not None:
            return cls.CANCELLED
        if token.endswith("+"):
            token = token[:-1]
        found = _BY_NAME.get(token) or _CODES.get(token)
        return found if found is not None else cls.UNKNOWN

    @property
    def terminal(self) -> bool:
        """True when the job has ended (see :data:`TERMINAL_STATES`)."""
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        """True when the job is queued or holds an allocation (see :data:`ACTIVE_STATES`)."""
        return self in ACTIVE_STATES

    @property
    def pending(self) -> bool:
        """True when the job waits in the queue without an allocation (:data:`PENDING_STATES`)."""
        return self in PENDING_STATES

    @property
    def failed(self) -> bool:
        """True when the job ended without completing (see :data:`FAILURE_STATES`)."""
        return self in FAILURE_STATES


def cancelled_by(text: object) -> int | None:
    """The uid in ``CANCELLED by <uid>``; None for any other text."""
    if not isinstance(text, str):
        return None
    match = _CANCELLED_BY.fullmatch(text.strip().upper())
    return int(match.group(1)) if match is not None else None


_CANCELLED_BY = re.compile(r"CANCELLED\s+BY\s+([0-9]{1,10})\+?")

_CODES: dict[str, JobState] = {
    "PD": JobState.PENDING,
    "R": JobState.RUNNING,
    "S": JobState.SUSPENDED,
    "CG": JobState.COMPLETING,
    "CD": JobState.COMPLETED,
    "CA": JobState.CANCELLED,
    "F": JobState.FAILED,
    "TO": JobState.TIMEOUT,
    "NF": JobState.NODE_FAIL,
    "PR": JobState.PREEMPTED,
    "BF": JobState.BOOT_FAIL,
    "DL": JobState.DEADLINE,
    "OOM": JobState.OUT_OF_MEMORY,
    "CF": JobState.CONFIGURING,
    "RQ": JobState.REQUEUED,
    "RF": JobState.REQUEUE_FED,
    "RH": JobState.REQUEUE_HOLD,
    "RS": JobState.RESIZING,
    "RV": JobState.REVOKED,
    "SI": JobState.SIGNALING,
    "SE": JobState.SPECIAL_EXIT,
    "SO": JobState.STAGE_OUT,
    "ST": JobState.STOPPED,
    "RD": JobState.RESV_DEL_HOLD,
}
_BY_NAME: dict[str, JobState] = {
    state.value: state for state in JobState if state is not JobState.UNKNOWN
}

#: Compact code of every state, as printed by ``squeue -o %t``.
STATE_CODES: dict[JobState, str] = {state: code for code, state in _CODES.items()}

PENDING_STATES: frozenset[JobState] = frozenset(
    {
        # Queued, no allocation yet.
        JobState.PENDING,
        # Going back into the queue; will become PENDING again.
        JobState.REQUEUED,
        JobState.REQUEUE_FED,
        JobState.REQUEUE_HOLD,
        # Held in the queue until someone releases the job.
        JobState.SPECIAL_EXIT,
        JobState.RESV_DEL_HOLD,
    }
)
"""States of a job that waits in the queue without an allocation."""

ACTIVE_STATES: frozenset[JobState] = PENDING_STATES | frozenset(
    {
        JobState.RUNNING,
        JobState.CONFIGURING,
        JobState.RESIZING,
        JobState.SIGNALING,
        # Still holds its allocation, even though nothing executes.
        JobState.SUSPENDED,
        JobState.STOPPED,
        # Processes may still run; the allocation is not free yet.
        JobState.COMPLETING,
        JobState.STAGE_OUT,
    }
)
"""States of a job that is queued or holds an allocation: keep polling."""

TERMINAL_STATES: frozenset[JobState] = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
        JobState.REVOKED,
    }
)
"""States of a job that has ended; its record only waits to be purged."""

FAILURE_STATES: frozenset[JobState] = TERMINAL_STATES - {JobState.COMPLETED}
"""Terminal states other than ``COMPLETED`` (cancellation counts as failure)."""
