"""One record per heterogeneous job, from the per-component lines Slurm prints.

``squeue`` and ``sacct`` list a heterogeneous job submitted as job ``123`` as one line per
component, ``123+0``, ``123+1``, ... (steps as ``123+0.batch``, ``123+1.0``), while
``sbatch --parsable`` answered ``123`` and ``scancel 123`` ends every component. The library
follows such a job by its id ``123``: :func:`fold_queue_records` and
:func:`fold_accounting_records` turn the component records into one record under that id
and leave every other record as it is.

The folded state is component 0's (the one running the batch script, whose exit status is
the job's), with two exceptions that keep it from claiming an end too early or too well:
while any component is not terminal (or unreadable) and component 0 is, the job is not over
(that component's state is taken); when every component is terminal and component 0
COMPLETED, a component that ended otherwise (FAILED, NODE_FAIL, ...) gives its state.
Pure functions of their input; they never raise.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TypeVar

from dagster_slurm.slurm.accounting import SacctRecord
from dagster_slurm.slurm.parsers import SqueueRecord
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.tres import combine_components

_MEMBER = re.compile(r"(?P<job>[0-9]+)\+(?P<offset>[0-9]+)")

RecordT = TypeVar("RecordT", SqueueRecord, SacctRecord)


def het_member(job_id: str) -> tuple[str, int] | None:
    """``("123", 1)`` for the component id ``123+1``; None for any other id."""
    match = _MEMBER.fullmatch(job_id)
    return (match.group("job"), int(match.group("offset"))) if match else None


def folded_state(states: list[JobState]) -> JobState:
    """The state of a heterogeneous job from its components' states, component 0 first
    (see the module docstring). An empty list gives ``UNKNOWN``."""
    if not states:
        return JobState.UNKNOWN
    leader = states[0]
    if leader.terminal:
        for state in states[1:]:
            if not state.terminal:
                return state
        if leader is JobState.COMPLETED:
            for state in states[1:]:
                if state is not JobState.COMPLETED:
                    return state
    return leader


def _fold(records: Mapping[str, RecordT]) -> dict[str, RecordT]:
    folded: dict[str, RecordT] = {}
    members: dict[str, dict[int, RecordT]] = {}
    for job_id, record in records.items():
        member = het_member(job_id)
        if member is None:
            folded[job_id] = record
        else:
            members.setdefault(member[0], {})[member[1]] = record
    for job_id, by_offset in members.items():
        ordered = [by_offset[offset] for offset in sorted(by_offset)]
        state = folded_state([record.state for record in ordered])
        first = ordered[0]
        # Component 0's record carries the job's figures; a missing component 0 (not
        # listed) leaves the state unknown rather than reading another component as it.
        if 0 not in by_offset:
            state = JobState.UNKNOWN
        folded[job_id] = dataclasses.replace(first, job_id=job_id, state=state)
    return folded


def fold_queue_records(records: Mapping[str, SqueueRecord]) -> dict[str, SqueueRecord]:
    """``squeue`` records keyed by id, heterogeneous components folded into their job."""
    return _fold(records)


def fold_accounting_records(records: Mapping[str, SacctRecord]) -> dict[str, SacctRecord]:
    """``sacct`` records keyed by id, heterogeneous components folded into their job; the
    folded record keeps component 0's figures (state folded as for ``squeue``), the largest
    ``MaxRSS`` of any component, the nodes of every component counted together (so
    ``node_hours`` covers the whole job; None when a component's count is unknown), GPU
    figures over every component (:func:`~dagster_slurm.slurm.tres.combine_components`),
    and every component's steps, those of component ``n > 0`` with ids ``+<n>.<step>``
    (``+1.0``) so that they stay apart from component 0's."""
    folded = _fold(records)
    for job_id, record in list(folded.items()):
        parts = sorted(
            (member[1], other) for other_id, other in records.items()
            if (member := het_member(other_id)) is not None and member[0] == job_id
        )
        if len(parts) > 1:
            steps = tuple(
                step if offset == 0 else dataclasses.replace(step, step_id=f"+{offset}.{step.step_id}")
                for offset, part in parts for step in part.steps
            )
            rss = [value for _, part in parts if (value := part.max_rss_bytes) is not None]
            counts = [part.num_nodes for _, part in parts]
            folded[job_id] = dataclasses.replace(
                record, steps=steps, max_rss_bytes=max(rss) if rss else None,
                num_nodes=None if None in counts else sum(c for c in counts if c is not None),
                gpu=combine_components(part.gpu for _, part in parts),
            )
    return folded
