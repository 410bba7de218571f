"""Job arrays: what squeue and sacct say about the tasks of an array (pure); the ``--array``
expression and the site's limit are in :mod:`dagster_slurm.slurm.array_spec` (re-exported
here, so that the whole array API is one import).

squeue lists each task of an array that started as ``<array>_<index>`` (one line each) and
folds the ones still waiting into one line, ``<array>_[5-999%10]`` or ``<array>_[5,7-9]``
(indices and ranges, the ``%P`` throttle last). sacct lists each task as
``<array>_<index>`` with its step lines (``<array>_<index>.batch``) and, while some wait,
the rest as one ``<array>_[...]`` line. ``MaxArraySize`` (``scontrol show config``) bounds
the task *index*: indices run from 0 to ``MaxArraySize - 1``; 0 means the site allows no
arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.accounting import SacctRecord
from dagster_slurm.slurm.array_spec import (  # re-exported: the array API in one place
    DEFAULT_MAX_ARRAY_SIZE,
    ArrayChunk,
    array_expression,
    max_array_size,
    parse_array_expression,
    split_for_arrays,
    validate_array_expression,
    validate_array_parallelism,
)
from dagster_slurm.slurm.parsers import SqueueRecord
from dagster_slurm.slurm.states import JobState

__all__ = [
    "DEFAULT_MAX_ARRAY_SIZE", "ArrayChunk", "ArrayQueueView", "array_expression",
    "fold_array_accounting", "fold_array_queue", "max_array_size", "parse_array_expression",
    "pending_range_of", "split_for_arrays", "task_index_of", "validate_array_expression",
    "validate_array_parallelism",
]


def task_index_of(job_id: str, array_id: str) -> int | None:
    """The task index of ``job_id`` when it names one task of array ``array_id``
    (``123_4`` -> 4); None for anything else: another job, the pending range
    (``123_[5-9]``), the array itself (``123``), a step of a task (``123_4.batch``)."""
    prefix = f"{array_id}_"
    if not job_id.startswith(prefix):
        return None
    rest = job_id[len(prefix):]
    return int(rest) if rest.isascii() and rest.isdigit() else None


def pending_range_of(job_id: str, array_id: str) -> frozenset[int] | None:
    """The task indices of the folded pending line of array ``array_id``
    (``123_[5-9,12%4]`` -> 5 to 9 and 12); None for any other job id, and for brackets
    whose content cannot be read as task indices."""
    prefix = f"{array_id}_["
    if not (job_id.startswith(prefix) and job_id.endswith("]")):
        return None
    try:
        indices, _ = parse_array_expression(job_id[len(prefix):-1], field="job_id")
    except ConfigurationError:
        return None
    return indices


@dataclass(frozen=True)
class ArrayQueueView:
    """What one squeue answer says of the tasks of one array."""

    states: Mapping[int, JobState]
    """The state of each task index squeue listed: a started task's own line, and PENDING
    for each index of the folded pending line. An index squeue did not list (ended and
    purged, or never part of the array) is absent."""
    pending_reason: str | None
    """Why the waiting tasks wait (``Resources``, ``Priority``, ``JobArrayTaskLimit`` ...):
    the reason of the folded pending line, else that of the lowest waiting task listed on a
    line of its own; None when no task waits or Slurm gives no reason."""
    listed: bool
    """Whether squeue listed any line of the array (False: none of its tasks is listed,
    for example all ended and purged, or a wrong array id)."""

    @property
    def pending(self) -> frozenset[int]:
        """Task indices waiting in the queue without an allocation (PENDING, and the
        requeue and hold states of :data:`~dagster_slurm.slurm.states.PENDING_STATES`)."""
        return frozenset(i for i, s in self.states.items() if s.pending)

    @property
    def running(self) -> frozenset[int]:
        """Task indices that started and have not ended (RUNNING, COMPLETING, SUSPENDED
        ...: active but not waiting). A task whose state was unreadable is in none of
        ``pending``, ``running`` and ``ended``."""
        return frozenset(i for i, s in self.states.items() if s.active and not s.pending)

    @property
    def ended(self) -> frozenset[int]:
        """Task indices in a terminal state (COMPLETED, FAILED, CANCELLED, TIMEOUT ...)."""
        return frozenset(i for i, s in self.states.items() if s.terminal)


def fold_array_queue(records: Iterable[SqueueRecord], array_id: str) -> ArrayQueueView:
    """The :class:`ArrayQueueView` of ``array_id`` from squeue records, with job ids as
    squeue prints them (:func:`~dagster_slurm.slurm.parsers.parse_squeue`). Lines of other
    jobs are ignored; a task's own line wins over the pending range. Never raises: a pending
    line whose brackets cannot be read still marks the array listed, with its reason."""
    states: dict[int, JobState] = {}
    waiting: set[int] = set()
    reasons: dict[int, str | None] = {}
    folded_reason: str | None = None
    listed = False
    for record in records:
        index = task_index_of(record.job_id, array_id)
        if index is not None:
            states[index] = record.state
            reasons[index] = record.reason
            listed = True
        elif record.job_id.startswith(f"{array_id}_["):
            listed = True
            waiting.update(pending_range_of(record.job_id, array_id) or ())
            folded_reason = record.reason
    for index in waiting:
        states.setdefault(index, JobState.PENDING)
    if folded_reason is None:
        # An array of one task, or a requeued task, waits on a line of its own.
        folded_reason = next((reasons[i] for i in sorted(reasons)
                              if states[i].pending and reasons[i] is not None), None)
    return ArrayQueueView(states, folded_reason, listed)


def fold_array_accounting(records: Mapping[str, SacctRecord],
                          array_id: str) -> dict[int, SacctRecord]:
    """The accounting record of each task of ``array_id`` by task index, from records keyed
    by job id as :func:`~dagster_slurm.slurm.accounting.parse_sacct` gives them (a task's
    step lines are already folded into its record). Other jobs are left out, and so is the
    ``<array>_[...]`` line of tasks that have not started: a task without a record has no
    accounting yet."""
    found: dict[int, SacctRecord] = {}
    for job_id, record in records.items():
        index = task_index_of(job_id, array_id)
        if index is not None:
            found[index] = record
    return found
