"""The decision of one ``reconcile_workers`` call, as a pure function.

:func:`plan_reconcile` takes a fresh :class:`~dagster_slurm.session.scaling.snapshot.SessionSnapshot`
(observed while the caller holds the session's reconcile lease), the intent, the caller's
own older observation (``observed``), the named releases, the submission budget and the
login node's clock, and returns a :class:`ReconcilePlan`: what to submit, release, cancel,
record as ended and settle. :mod:`dagster_slurm.session.scaling.reconcile` carries the plan out.

The rules (each one a property test):

* **Members** of an intent are the live worker allocations recorded with its key. Nothing
  else is counted or released: an allocation added with ``add_worker_allocation`` belongs to
  no intent.
* **Committed** members are pending or running, not released and without a drain deadline;
  a member whose state is unknown counts as committed (never as absent). Submissions of
  the intent whose job id is not recorded count too, until they are settled (found by their
  token, or known lost).
* **Nothing is decided on an unknown.** When the scheduler did not answer, the plan submits,
  releases and cancels nothing and settles nothing; ``held_back`` says why.
* **Submissions** happen only when the count is short, the session is open, ``observed`` is
  not older than ``max_observation_age`` and names the same head as now, and the budget
  allows; each of these that stops a submission is one ``held_back`` sentence.
* **Scale-in** releases named allocations first (``release=``), then the surplus: pending
  ones first, then running ones with the least time left. A member that hosts the head
  counts and is never released; a released one's persisted deadline never moves.
* **Deadlines**: a release persists ``drain_deadline`` (now + the drain time) before the
  drain starts. A member whose deadline passed more than ``grace`` seconds ago and still
  runs is cancelled; one that drains without having seen its drain yet gets it again with
  the same deadline.
* **pending_timeout**: a member this intent submitted that is still pending that long after
  its submission is cancelled (a release with deadline now) and still counts in this call,
  so it is not replaced at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dagster_slurm.protocol import (
    DRAIN_GRACE_SECONDS,
    SUBMIT_GRACE_SECONDS,
    WALLTIME_MARGIN_SECONDS,
    WORKER_DRAINING,
    WORKER_RELEASED,
)
from dagster_slurm.session.scaling.intents import WorkerIntent
from dagster_slurm.session.scaling.snapshot import ENDED, AllocationSnapshot, SessionSnapshot
from dagster_slurm.slurm.states import JobState

#: Seconds after a persisted drain deadline before a member that still runs is cancelled.
DRAIN_GRACE = DRAIN_GRACE_SECONDS
#: Seconds after which an unsettled submission that squeue does not list counts as lost.
SETTLE_AFTER = SUBMIT_GRACE_SECONDS
#: A drain that runs until the walltime ends this many seconds before it.
WALLTIME_MARGIN = WALLTIME_MARGIN_SECONDS


@dataclass(frozen=True)
class Release:
    """Release ``job_id``: persist ``deadline`` (login node epoch seconds), then cancel it
    (``pending``: it has not started) or drain it through Ray until ``deadline``."""

    job_id: str
    deadline: float
    pending: bool
    reason: str


@dataclass(frozen=True)
class ReconcilePlan:
    """What one call does (see the module docstring); every tuple may be empty."""

    submit: int = 0
    """Allocations to submit with the intent's shape."""
    releases: tuple[Release, ...] = ()
    """Releases to start: deadline persisted first, then cancel or drain."""
    redrain: tuple[Release, ...] = ()
    """Drains to send again, with the deadline persisted earlier."""
    cancel: tuple[str, ...] = ()
    """Members past their drain deadline (plus grace) that still run."""
    ended: tuple[tuple[str, str | None], ...] = ()
    """Members whose job ended: (job id, final state or None) to record released."""
    found: tuple[tuple[str, str], ...] = ()
    """Unsettled submissions squeue lists by token: (token, job id); reported recovered."""
    lost: tuple[str, ...] = ()
    """Unsettled submissions squeue does not list after :data:`SETTLE_AFTER` s: tokens."""
    live: tuple[str, ...] = ()
    """Members that count toward the intent after the plan (submissions not included)."""
    in_flight: int = 0
    """Unsettled submissions of the intent still counted (not found, not lost)."""
    held_back: tuple[str, ...] = field(default_factory=tuple)
    """Why less was submitted or done than the count asks for."""


def _ended(worker: AllocationSnapshot) -> bool:
    if worker.state is None:
        return False
    return worker.state == ENDED or JobState.parse(worker.state).terminal


def _running(worker: AllocationSnapshot) -> bool:
    return worker.state == JobState.RUNNING.value


def _pending(worker: AllocationSnapshot) -> bool:
    return worker.state is not None and worker.state != ENDED and JobState.parse(
        worker.state).pending


def drain_seconds(intent: WorkerIntent, worker: AllocationSnapshot) -> float:
    """How long ``worker`` drains once released: the intent's ``drain_timeout``, else until
    :data:`WALLTIME_MARGIN` s before its walltime (600 s when its time left is unknown)."""
    if intent.drain_timeout is not None:
        return float(intent.drain_timeout)
    left = worker.time_left_seconds
    if left is None or not math.isfinite(left):
        return 600.0
    return max(0.0, left - WALLTIME_MARGIN)


def plan_reconcile(intent: WorkerIntent, snapshot: SessionSnapshot, now: float, *,
                   observed: SessionSnapshot | None = None,
                   max_observation_age: float = 300.0,
                   release: tuple[str, ...] = (),
                   max_submissions: int | None = None,
                   grace: float = DRAIN_GRACE) -> ReconcilePlan:
    """The plan of one call; see the module docstring. Pure."""
    members = snapshot.workers(intent.key)
    if not snapshot.certain:
        return _uncertain(intent, snapshot, members)
    held: list[str] = []
    ended, active, cancel, redrain = _cleanup(members, now, grace)
    found, lost, in_flight = _settle(intent, snapshot, now)
    undrained = [w for w in active if w.drain_deadline is None]
    releases, expired = _expire(intent, undrained, now, held)
    remaining = [w for w in undrained if w.slurm_job_id not in {e.slurm_job_id for e in expired}]
    releases += _named(intent, remaining, set(release), now, held)
    released_ids = {r.job_id for r in releases}
    counted = [w for w in remaining if w.slurm_job_id not in released_ids]
    committed = len(counted) + len(found) + in_flight + len(expired)
    releases += _scale_in(intent, counted, committed - intent.count, now, held)
    released_ids = {r.job_id for r in releases}
    live = tuple(w.slurm_job_id for w in counted if w.slurm_job_id not in released_ids)
    live += tuple(job_id for _, job_id in found)
    submit = _submissions(intent.count - committed, snapshot, now, observed,
                          max_observation_age, max_submissions, held)
    return ReconcilePlan(
        submit=submit, releases=tuple(releases), redrain=tuple(redrain), cancel=tuple(cancel),
        ended=ended, found=tuple(found), lost=tuple(lost), live=live, in_flight=in_flight,
        held_back=tuple(held))


def _uncertain(intent: WorkerIntent, snapshot: SessionSnapshot,
               members: tuple[AllocationSnapshot, ...]) -> ReconcilePlan:
    """Nothing is decided when the scheduler did not answer."""
    reason = ("the scheduler did not answer"
              + (f" ({snapshot.error.strip()})" if snapshot.error else "")
              + ": nothing was submitted, released or cancelled; call again")
    in_flight = sum(1 for s in snapshot.submissions
                    if s.intent == intent.key and s.status != "failed")
    live = tuple(w.slurm_job_id for w in members
                 if w.drain_deadline is None and w.committed is not False)
    return ReconcilePlan(live=live, in_flight=in_flight, held_back=(reason,))


def _cleanup(members: tuple[AllocationSnapshot, ...], now: float, grace: float) -> tuple[
        tuple[tuple[str, str | None], ...], list[AllocationSnapshot], list[str], list[Release]]:
    """Members whose job ended, the others, drains past their deadline, drains to resend."""
    ended = tuple((w.slurm_job_id, None if w.state == ENDED else w.state)
                  for w in members if _ended(w))
    gone = {job_id for job_id, _ in ended}
    active = [w for w in members if w.slurm_job_id not in gone]
    cancel: list[str] = []
    redrain: list[Release] = []
    for w in active:
        if w.drain_deadline is None:
            continue
        if now >= w.drain_deadline + grace:
            cancel.append(w.slurm_job_id)
        elif (_running(w) and now < w.drain_deadline and w.worker_state != WORKER_DRAINING
              and not (w.worker_state or "").startswith(WORKER_RELEASED)):
            redrain.append(Release(w.slurm_job_id, w.drain_deadline, False,
                                   "its drain was not seen by the allocation yet"))
    return ended, active, cancel, redrain


def _settle(intent: WorkerIntent, snapshot: SessionSnapshot,
            now: float) -> tuple[list[tuple[str, str]], list[str], int]:
    """The intent's submissions without a recorded job id: found by token, lost, in flight."""
    found: list[tuple[str, str]] = []
    lost: list[str] = []
    in_flight = 0
    known_ids = {w.slurm_job_id for w in snapshot.allocations}
    for sub in snapshot.submissions:
        if sub.intent != intent.key:
            continue
        if sub.found_job_id is not None and sub.found_job_id not in known_ids:
            found.append((sub.token, sub.found_job_id))
        elif sub.status == "failed":
            continue  # sbatch refused it and squeue lists no job with its token
        elif sub.submitted_at is not None and now - sub.submitted_at >= SETTLE_AFTER:
            lost.append(sub.token)
        else:
            in_flight += 1
    return found, lost, in_flight


def _expire(intent: WorkerIntent, undrained: list[AllocationSnapshot], now: float,
            held: list[str]) -> tuple[list[Release], list[AllocationSnapshot]]:
    """Members pending past ``pending_timeout``: cancelled, yet counted in this call."""
    if intent.pending_timeout is None:
        return [], []
    limit = intent.pending_timeout
    expired = [w for w in undrained if w.submitted_at is not None and _pending(w)
               and not w.hosts_head and now - w.submitted_at >= limit]
    if expired:
        held.append(f"{len(expired)} allocation(s) pending longer than pending_timeout="
                    f"{limit:g} s cancelled ({', '.join(w.slurm_job_id for w in expired)}); "
                    "not replaced in this call")
    return [Release(w.slurm_job_id, now, True, f"pending longer than pending_timeout={limit:g} s")
            for w in expired], expired


def _named(intent: WorkerIntent, remaining: list[AllocationSnapshot], named: set[str],
           now: float, held: list[str]) -> list[Release]:
    """Releases named in ``release=`` (never the head's host)."""
    releases = []
    for w in remaining:
        if w.slurm_job_id not in named:
            continue
        if w.hosts_head:
            held.append(f"allocation {w.slurm_job_id} hosts the run's Ray head: not released "
                        "(move the head first)")
            continue
        releases.append(_release(intent, w, now, "named in release="))
    return releases


def _scale_in(intent: WorkerIntent, counted: list[AllocationSnapshot], surplus: int,
              now: float, held: list[str]) -> list[Release]:
    """The surplus: pending members first, then running ones with the least time left."""
    if surplus <= 0:
        return []
    candidates = sorted(
        (w for w in counted if not w.hosts_head and w.committed is True),
        key=lambda w: (0 if _pending(w) else 1,
                       w.time_left_seconds if w.time_left_seconds is not None else math.inf,
                       -len(w.slurm_job_id), w.slurm_job_id))
    if len(candidates) < surplus:
        held.append(f"{surplus - len(candidates)} allocation(s) over count={intent.count} could "
                    "not be released now (the head's host, a submission in flight, or a state "
                    "not known)")
    return [_release(intent, w, now, f"surplus over count={intent.count}")
            for w in candidates[:surplus]]


def _submissions(need: int, snapshot: SessionSnapshot, now: float,
                 observed: SessionSnapshot | None, max_observation_age: float,
                 max_submissions: int | None, held: list[str]) -> int:
    """How many to submit for a shortfall of ``need``; each reason to hold back is said."""
    if need <= 0:
        return 0
    submit = need
    if snapshot.closed:
        held.append("the session is closed: nothing is submitted for it")
        submit = 0
    if observed is not None:
        age = observed.age(now)
        if age is None or age > max_observation_age:
            said = "of unknown age" if age is None else f"{age:.0f} s old"
            held.append(f"observed is {said} (max_observation_age {max_observation_age:g} s): "
                        "nothing submitted; inspect again")
            submit = 0
        if observed.head_job_id != snapshot.head_job_id:
            held.append(f"the head changed since observed (was {observed.head_job_id}, now "
                        f"{snapshot.head_job_id}): nothing submitted; inspect again")
            submit = 0
    if submit and max_submissions is not None and max_submissions < submit:
        held.append(f"max_submissions={max_submissions}: {max_submissions} of {submit} "
                    "submission(s) made")
        submit = max_submissions
    return submit


def _release(intent: WorkerIntent, worker: AllocationSnapshot, now: float,
             reason: str) -> Release:
    if not _running(worker):
        return Release(worker.slurm_job_id, now, True, reason)
    return Release(worker.slurm_job_id, now + drain_seconds(intent, worker), False, reason)
