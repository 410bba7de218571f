"""The status poll of a run's job arrays: one squeue for every task, folded per task.

One :meth:`ArrayPoll.observe` is one squeue of the step's job name (it also rewrites the
heartbeat file every task's dead-man's switch watches). Slurm lists the tasks that started
as ``<array>_<index>`` and folds those still waiting into one line (``<array>_[5-999%10]``);
:func:`~dagster_slurm.slurm.arrays.fold_array_queue` turns that into a state per task index.
While no task of an array has started, the pending line is judged as a single job's would be
(:class:`~dagster_slurm.jobs.pending.PendingTracker`: the scheduler's reason and estimate in
the log, a fatal reason fails the step).

Fail safe: a poll whose squeue failed tells nothing (no task ends by it). A task that squeue no
longer lists (the array left the queue, or the task was purged after ``MinJobAge``) is
reported with no state once :data:`GONE_AFTER` certain polls in a row missed it; the runner
then reads the task's exit-status file, and a task without one ends as UNKNOWN, a failure,
never a success.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dagster_slurm.backoff import PollBackoff
from dagster_slurm.jobs.pending import PendingPolicy, PendingTracker
from dagster_slurm.scheduler.client import JobObservation, SlurmScheduler
from dagster_slurm.scheduler.watcher import heartbeat_content
from dagster_slurm.slurm.arrays import ArrayQueueView, fold_array_queue
from dagster_slurm.slurm.states import JobState

__all__ = ["GONE_AFTER", "ArrayPoll", "TaskSeen"]

#: Certain polls in a row that must miss a task before it is reported gone.
GONE_AFTER = 3


@dataclass(frozen=True)
class TaskSeen:
    """A task of a job array that a poll showed started or ended: ``state`` its scheduler
    state (None: squeue no longer lists it, see :attr:`gone`)."""

    array_id: str
    index: int
    state: JobState | None
    gone: bool = False


class ArrayPoll:
    """Polls the run's arrays (see the module docstring). ``heartbeat``: the file each poll
    rewrites (None: no dead-man's switch); ``sleep`` and ``clock`` for tests."""

    def __init__(self, scheduler: SlurmScheduler, job_name: str, pending: PendingPolicy,
                 log: Any, *, heartbeat: str | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.scheduler = scheduler
        self.job_name = job_name
        self.log = log
        self.heartbeat = heartbeat
        self.views: dict[str, ArrayQueueView] = {}
        self.backoff = PollBackoff(initial=0.5, maximum=5.0)
        self._pending = pending
        self._trackers: dict[str, PendingTracker] = {}
        self._started: set[str] = set()
        self._missing: dict[tuple[str, int], int] = {}
        self._seq = 0
        self._sleep = sleep
        self._clock = clock
        self._submitted: dict[str, float] = {}
        self._first_seen: dict[tuple[str, int], float] = {}

    def observe(self, arrays: Mapping[str, Any]) -> list[TaskSeen]:
        """One squeue for the arrays ``arrays`` (array job id -> the runner's record, whose
        ``positions`` maps the task indices that matter); the tasks seen started or ended,
        or gone (see :data:`GONE_AFTER`)."""
        self._seq += 1
        beats = {self.heartbeat: heartbeat_content(self._seq)} if self.heartbeat else None
        snapshot = self.scheduler.status([self.job_name], accounting=False, heartbeats=beats)
        if not snapshot.certain:
            self.log.debug(f"squeue gave no answer ({snapshot.error}); nothing is concluded")
            return []
        seen: list[TaskSeen] = []
        for array_id, array in arrays.items():
            view = fold_array_queue(snapshot.queue.values(), array_id)
            self.views[array_id] = view
            self._judge_pending(array_id, view, snapshot.queue)
            for index in array.positions:
                state = view.states.get(index)
                if state is None:
                    missed = self._missing.get((array_id, index), 0) + 1
                    self._missing[(array_id, index)] = missed
                    if missed >= GONE_AFTER:
                        seen.append(TaskSeen(array_id, index, None, gone=True))
                    continue
                self._missing.pop((array_id, index), None)
                if state is not JobState.PENDING:
                    self._first_seen.setdefault((array_id, index), self._clock())
                    seen.append(TaskSeen(array_id, index, state))
        return seen

    def submitted(self, array_id: str) -> None:
        """The array was submitted now (the start of its tasks' observed queue wait)."""
        self._submitted[array_id] = self._clock()

    def queue_wait(self, array_id: str, index: int) -> float | None:
        """Seconds from the array's submission to the first poll that saw the task started
        (to within a poll interval); None when not observed."""
        start, seen = self._submitted.get(array_id), self._first_seen.get((array_id, index))
        return None if start is None or seen is None else max(0.0, seen - start)

    def drained(self, array_id: str | None) -> bool:
        """Whether the array has no task left waiting in the queue (all started or ended)."""
        view = self.views.get(array_id or "")
        return view is not None and view.listed and not view.pending

    def pause(self, *, changed: bool) -> None:
        """Sleep until the next poll: shortly after a poll that saw tasks start or end,
        longer (up to 5 s) while nothing changes."""
        self._sleep(self.backoff.observe(changed))

    def _judge_pending(self, array_id: str, view: ArrayQueueView,
                       queue: Mapping[str, Any]) -> None:
        if array_id in self._started or not view.listed:
            return
        if view.running or view.ended:
            self._started.add(array_id)
            self.log.info(f"Slurm job array {array_id}: tasks are running "
                          f"({len(view.running)} running, {len(view.pending)} waiting)")
            return
        record = next((r for job_id, r in queue.items()
                       if job_id.startswith(f"{array_id}_[")), None)
        tracker = self._trackers.get(array_id)
        if tracker is None:
            tracker = PendingTracker(array_id, self._pending, self.log.info,
                                     warn=self.log.warning)
            self._trackers[array_id] = tracker
        tracker(JobObservation(array_id, JobState.PENDING, view.pending_reason,
                               record.start_time if record is not None else None,
                               source="squeue", queue=record))
