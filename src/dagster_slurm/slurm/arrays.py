"""Job arrays: what squeue and sacct say about the tasks of an array (pure); the ``--array``
expression and the site's limit are in :mod:`dagster_slurm.slurm.array_spec` (re-exported).

squeue lists the tasks of an array that started as ``<array>_<index>`` (one line each) and
folds the ones still waiting into one line, ``<array>_[5-999%10]`` (indices and ranges,
the ``%N`` throttle last). sacct lists each task as ``<array>_<index>`` with its step lines
(``<array>_<index>.batch``) and, while some wait, the rest as ``<array>_[...]``.
``MaxArraySize`` (``scontrol show config``) bounds the task *index*: indices run from 0 to
``MaxArraySize - 1``; 0 means the site allows no arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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
    "split_for_arrays", "task_index_of", "validate_array_expression",
    "validate_array_parallelism",
]

def task_index_of(job_id: str, array_id: str) -> int | None:
    """The task index of ``job_id`` when it names one task of array ``array_id``
    (``123_4`` -> 4); None for anything else (another job, a pending range, a step)."""
    prefix = f"{array_id}_"
    if not job_id.startswith(prefix):
        return None
    rest = job_id[len(prefix):]
    return int(rest) if rest.isdigit() else None


@dataclass(frozen=True)
class ArrayQueueView:
    """What one squeue answer says of the tasks of one array: ``states`` by task index (the
    folded pending line gives each of its indices PENDING), ``pending_reason`` (the
    scheduler's reason on that line, None without one or without the line) and ``listed``
    (whether any line of the array was there)."""

    states: Mapping[int, JobState]
    pending_reason: str | None
    listed: bool

    @property
    def pending(self) -> frozenset[int]:
        return frozenset(i for i, s in self.states.items() if s is JobState.PENDING)

    @property
    def ended(self) -> frozenset[int]:
        return frozenset(i for i, s in self.states.items() if s.terminal)

    @property
    def running(self) -> frozenset[int]:
        """Started and not ended (RUNNING, COMPLETING, ...)."""
        return frozenset(i for i, s in self.states.items()
                         if s is not JobState.PENDING and not s.terminal)


def fold_array_queue(records: Iterable[SqueueRecord], array_id: str) -> ArrayQueueView:
    """The :class:`ArrayQueueView` of ``array_id`` from squeue records (other jobs'
    lines are ignored)."""
    states: dict[int, JobState] = {}
    reason: str | None = None
    listed = False
    for record in records:
        job_id = record.job_id
        index = task_index_of(job_id, array_id)
        if index is not None:
            states[index] = record.state
            listed = True
        elif job_id.startswith(f"{array_id}_[") and job_id.endswith("]"):
            listed = True
            indices, _ = parse_array_expression(job_id[len(array_id) + 2:-1])
            for pending in indices:
                states.setdefault(pending, JobState.PENDING)
            reason = record.reason
    return ArrayQueueView(states, reason, listed)


def fold_array_accounting(records: Mapping[str, SacctRecord], array_id: str) -> dict[int, SacctRecord]:
    """The accounting record of each task of ``array_id`` by task index (records keyed by
    job id, as :func:`~dagster_slurm.slurm.accounting.parse_sacct` gives them)."""
    found = {}
    for job_id, record in records.items():
        index = task_index_of(job_id, array_id)
        if index is not None:
            found[index] = record
    return found
