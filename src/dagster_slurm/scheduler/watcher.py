"""Follow jobs until they finish, with one scheduler query per poll for all of them.

A :class:`JobWatcher` tracks the jobs of one or more job names. Every poll is one agent
request: one ``squeue`` for all tracked names (every state, so a final state stays visible
until Slurm purges the job after ``MinJobAge``), the jobs' exit-status files, and one
batched ``sacct`` only for tracked jobs that have left ``squeue``. The scheduler's state
decides how a job ended; a status file only gives the exit code.
The interval backs off while nothing changes and resets on a change; once a tracked job
has gone missing from ``squeue`` at a long interval, ``MinJobAge`` is read (once) and the
interval kept below half of it, so a final state is normally read from ``squeue`` itself
(the configuration is not read before: one RPC per process that most runs never need). Threads waiting on different jobs share polls: a poll younger than the current
interval is reused. A job tracked with a heartbeat file gets new content in it (this
machine's clock, host, pid and a sequence number) with every poll, in the same round trip:
that is what keeps its job script's dead-man's switch from firing, and what the orphan
reconciliation reads as the waiting step's sign of life.

Polls are served from the login user's shared squeue answer (see
:meth:`~dagster_slurm.scheduler.client.SlurmScheduler.status_op`): however many processes
of one user watch jobs, the scheduler sees about one squeue per ``status_max_age``. Once
every tracked job runs, a poll asks for states only (``state_only``): on a Slurm release
with ``squeue --only-job-state`` that lighter query of the tracked ids answers instead (a
job's other queue fields then stay those of its last full listing).

The exit-status shortcut: whoever sees a tracked job's exit-status file appear (the Pipes
reader reads it in the round trip of its tail) calls :meth:`JobWatcher.payload_ended`. The
job's waiter then polls at once, with an answer taken after that moment, instead of at the
end of its back-off; so a job that ends before the first poll (``first_poll`` seconds after
:meth:`JobWatcher.wait` started) costs one squeue. The status file never decides that the
job has ended: only the scheduler's state does (the batch script may still run its own
epilogue after writing it), and while the scheduler still lists the job as running, the
waiter keeps asking for answers newer than each poll, at the back-off's pace.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dagster_slurm.backoff import sleep_checking
from dagster_slurm.errors import AuthenticationFailed, TransportError
from dagster_slurm.scheduler.client import JobObservation, SlurmScheduler, StatusSnapshot
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.slurm.states import JobState

log = logging.getLogger("dagster_slurm.scheduler")

#: Polls a job may stay unobservable (absent from squeue, no status file, no accounting)
#: before it is reported as lost.
LOST_AFTER_POLLS = 5


@dataclass(frozen=True)
class _Tracked:
    job_name: str
    status_file: str | None
    heartbeat_file: str | None = None


def heartbeat_content(seq: int, clock: Callable[[], float] = time.time) -> str:
    """One heartbeat's text: ``<epoch seconds> <host> <pid> <seq>`` (new at every call with
    a new ``seq``). The first word is this machine's clock, what the orphan reconciliation
    compares with its own."""
    return f"{clock():.3f} {socket.gethostname()} {os.getpid()} {seq}\n"


def with_earlier_fields(snapshot: StatusSnapshot, earlier: StatusSnapshot) -> StatusSnapshot:
    """``snapshot`` (a state-only answer, whose queue records hold job id and state only)
    with each job's other queue fields (nodes, partition, times...) taken from its record
    in ``earlier``, so that who reads a job's nodes after it ended still finds them."""
    queue = {
        job_id: dataclasses.replace(earlier.queue[job_id], state=record.state,
                                    raw_state=record.raw_state)
        if job_id in earlier.queue and record.name is None else record
        for job_id, record in snapshot.queue.items()
    }
    return dataclasses.replace(snapshot, queue=queue)


class JobLost(Exception):
    """A tracked job left the queue and neither a status file nor accounting says how."""


class JobWatcher:
    """Polls the scheduler for tracked jobs (see the module docstring)."""

    def __init__(
        self,
        scheduler: SlurmScheduler,
        *,
        backoff: PollBackoff | None = None,
        accounting: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.scheduler = scheduler
        self.backoff = backoff or PollBackoff()
        self.accounting = accounting
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._last: StatusSnapshot | None = None
        self._last_at = float("-inf")
        self._last_states: dict[str, tuple[JobState | None, str | None]] = {}
        self._unseen: dict[str, int] = {}
        self._min_job_age_checked = False
        self._beats = 0
        self._ended: set[str] = set()
        self._woken = threading.Condition()
        self._custom_sleep = sleep is not time.sleep

    def track(self, job_id: str, job_name: str, status_file: str | None = None,
              heartbeat_file: str | None = None) -> None:
        """Include ``job_id`` (of ``job_name``) in every poll from now on; with
        ``heartbeat_file``, every poll also writes new content to it."""
        with self._lock:
            self._tracked[job_id] = _Tracked(job_name, status_file, heartbeat_file)
            self._last_at = float("-inf")

    def untrack(self, job_id: str) -> None:
        """Stop polling for ``job_id``."""
        with self._lock:
            self._tracked.pop(job_id, None)
            self._unseen.pop(job_id, None)
            self._ended.discard(job_id)

    def payload_ended(self, job_id: str) -> None:
        """``job_id``'s exit-status file exists: its waiter polls now, and every poll until
        the scheduler says the job has ended needs an answer taken after it started (see the
        module docstring). Ignored for a job that is not tracked."""
        with self._lock:
            if job_id not in self._tracked or job_id in self._ended:
                return
            self._ended.add(job_id)
            self._last_at = float("-inf")
            self.backoff.observe(True)
        with self._woken:
            self._woken.notify_all()

    @property
    def interval(self) -> float:
        """Seconds between polls right now."""
        return self.backoff.current

    def poll(self, *, force: bool = False) -> StatusSnapshot:
        """One scheduler query for every tracked job, or the last one if it is still fresh."""
        with self._lock:
            now = self._clock()
            if not force and self._last is not None and now - self._last_at < self.backoff.current:
                return self._last
            tracked = dict(self._tracked)
            fresh = bool(self._ended & tracked.keys())
            names = sorted({t.job_name for t in tracked.values()})
            files = {j: t.status_file for j, t in tracked.items() if t.status_file}
            self._beats += 1
            beats = {t.heartbeat_file: heartbeat_content(self._beats)
                     for t in tracked.values() if t.heartbeat_file}
            state_only = self._all_running(tracked)
            snapshot = self.scheduler.status(
                names, list(tracked), status_files=files, accounting=self.accounting,
                heartbeats=beats, shared=True, fresh=fresh, state_only=state_only,
            )
            if state_only and self._last is not None:
                snapshot = with_earlier_fields(snapshot, self._last)
            self._record(snapshot, tracked)
            self._last, self._last_at = snapshot, self._clock()
            return snapshot

    def _all_running(self, tracked: dict[str, _Tracked]) -> bool:
        """Whether every tracked job was last seen holding its allocation (running, not
        queued): then a poll needs only their states (``state_only``, see
        :meth:`~dagster_slurm.scheduler.client.SlurmScheduler.status_op`)."""
        states = [self._last_states.get(job_id, (None, None))[0] for job_id in tracked]
        return bool(states) and all(
            state is not None and state.active and not state.pending for state in states
        )

    def _record(self, snapshot: StatusSnapshot, tracked: dict[str, _Tracked]) -> None:
        states = {j: (o.state, o.reason) for j in tracked for o in [snapshot.job(j)]}
        changed = states != {j: self._last_states.get(j) for j in tracked}
        self._last_states.update(states)
        self.backoff.observe(changed)
        for job_id in tracked:
            if snapshot.certain and snapshot.job(job_id).state is None:
                self._unseen[job_id] = self._unseen.get(job_id, 0) + 1
            else:
                self._unseen.pop(job_id, None)
        if not self._min_job_age_checked and self._unseen and self.backoff.current >= 10:
            self._min_job_age_checked = True
            try:
                age = self.scheduler.min_job_age()
            except Exception as exc:  # noqa: BLE001 - a missing config only loses an optimisation
                log.debug("could not read MinJobAge: %s", exc)
                age = None
            if age:
                self.backoff.cap(max(age / 2, self.backoff.initial))

    def observe(self, job_id: str) -> JobObservation:
        """The tracked job as of a fresh-enough poll; raises :class:`JobLost` if it vanished."""
        snapshot = self.poll()
        observation = snapshot.job(job_id)
        if observation.state is None and self._unseen.get(job_id, 0) >= LOST_AFTER_POLLS:
            if observation.exit_code is not None:
                raise JobLost(
                    f"job {job_id} left the queue and accounting has no final state for it; "
                    f"its status file says exit code {observation.exit_code}, which is not "
                    "taken as its outcome (a job Slurm cancelled, timed out or preempted can "
                    "leave one), so how it ended is unknown"
                )
            raise JobLost(
                f"job {job_id} left the queue and neither its status file nor accounting "
                "reports how it ended"
            )
        return observation

    def wait(
        self,
        job_id: str,
        *,
        on_poll: Callable[[JobObservation], None] | None = None,
        timeout: float | None = None,
        transport_retries: int = 5,
        check: Callable[[], None] | None = None,
        check_interval: float = 3.0,
        first_poll: float = 0.0,
    ) -> JobObservation:
        """Poll until ``job_id`` is terminal; ``on_poll`` sees every observation.

        ``check`` (None: none) is called at least every ``check_interval`` seconds between
        polls, however long the back-off; it raises to stop waiting (e.g. the step's Dagster
        run has ended). ``first_poll``: seconds before the first poll (cut short by
        :meth:`payload_ended`); 0 polls at once.

        Transient transport errors are retried ``transport_retries`` times in a row before
        they propagate; a failed login (:class:`~dagster_slurm.errors.AuthenticationFailed`,
        :class:`~dagster_slurm.errors.LoginRequired`) propagates at once. ``timeout`` (seconds, None for no limit) raises :class:`TimeoutError`.
        """
        deadline = None if timeout is None else self._clock() + timeout
        failures = 0
        if first_poll > 0:
            self._pause(job_id, first_poll, check, check_interval)
        while True:
            try:
                observation = self.observe(job_id)
                failures = 0
            except AuthenticationFailed:
                raise  # a login that needs a person, or refused credentials: retrying cannot help
            except TransportError as exc:
                failures += 1
                if failures > transport_retries:
                    raise
                log.warning("scheduler poll failed (%s); retrying", exc)
                self._pause(job_id, self.backoff.current, check, check_interval)
                continue
            if on_poll is not None:
                on_poll(observation)
            if observation.terminal:
                return observation
            if deadline is not None and self._clock() >= deadline:
                raise TimeoutError(f"job {job_id} did not finish within {timeout} s")
            self._pause(job_id, self.backoff.current, check, check_interval)

    def _pause(self, job_id: str, seconds: float, check: Callable[[], None] | None,
               check_interval: float) -> None:
        """Wait ``seconds`` between two polls of ``job_id``, calling ``check`` at least every
        ``check_interval`` seconds; returns early once :meth:`payload_ended` was called for
        it (at once when it already was and no poll has been made since)."""
        if self._custom_sleep:
            sleep_checking(self._sleep, seconds, check, check_interval)
            return
        end = self._clock() + seconds
        while True:
            with self._lock:
                hinted = job_id in self._ended and self._last_at == float("-inf")
            remaining = end - self._clock()
            if hinted or remaining <= 0:
                return
            with self._woken:
                self._woken.wait(min(remaining, check_interval))
            if check is not None:
                check()
