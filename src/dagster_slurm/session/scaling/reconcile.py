"""The scaling hooks' I/O: ``inspect``, ``reconcile_workers`` and ``assign_worker_intent``.

:func:`inspect` is one round trip (the agent's ``observe_session``): a
:class:`~dagster_slurm.session.scaling.snapshot.SessionSnapshot`.

:func:`reconcile_workers` is two round trips when nobody else reconciles the session:

1. Take the session's reconcile lease (``/leases/reconcile-workers``, 120 s) and observe the
   session, in one batch. While another process holds the lease the call waits (one
   transaction per try, a quarter to half a second apart, and no scheduler query; logged)
   and observes again once it was released or expired; a
   dead holder blocks for at most the lease's lifetime.
2. Decide (:func:`~dagster_slurm.session.scaling.plan.plan_reconcile`, pure) and act, in
   one batch: settle interrupted submissions found by their token, record ended
   allocations released, persist each release's drain deadline before its cancel or drain
   signal (``after``: the signal is sent only once the deadline is written), cancel drains
   past their deadline, submit, give the lease back. Every transaction and every
   submission is guarded by the lease's owner: a process whose lease expired and was taken
   over changes nothing, so two processes never both act on the same observation. A
   submission records its token before sbatch runs and carries it in ``--comment``.

Nothing runs in the background, and an unknown is never acted upon: when the scheduler did
not answer nothing is submitted, released or cancelled.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster_slurm.errors import LockTimeout
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.scheduler.client import new_token
from dagster_slurm.session.core.batch_io import Cancel, Signal, Step, StepOutcome, Submit, Txn
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.submission import Fence, submit_request
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.scaling import plan as policy
from dagster_slurm.session.scaling.intents import (
    DEFAULT_MAX_OBSERVATION_AGE,
    ReconcileResult,
    WorkerIntent,
    check_budget,
    check_key,
    check_release,
)
from dagster_slurm.session.scaling.plan import ReconcilePlan, plan_reconcile
from dagster_slurm.session.scaling.snapshot import SessionSnapshot, build_snapshot
from dagster_slurm.session.workers.job_script import REMOVAL_SIGNAL
from dagster_slurm.slurm.submit_limits import RefusalKind, classify_refusal
from dagster_slurm.state import lease
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt
from dagster_slurm.state.schema import SessionDocument

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext

RECONCILE_LEASE = "reconcile-workers"
#: Seconds the reconcile lease lives: a holder that died blocks others at most this long.
RECONCILE_LEASE_TTL = 120.0
#: Seconds a call waits for the lease before it gives up (LockTimeout).
LEASE_WAIT = 300.0
#: Seconds between two tries for a busy lease (plus up to as much again, at random).
LEASE_POLL = 0.25


def inspect(session: SessionContext) -> SessionSnapshot:
    """One observation of every allocation of ``session`` (one round trip)."""
    observed = session.io.observe(None)
    return build_snapshot(observed.doc, observed.status, observed.files, session.paths)


def assign_worker_intent(session: SessionContext, job_id: str, key: str | None) -> None:
    """Move worker allocation ``job_id`` into intent ``key`` (None: out of every intent),
    under the session lock; raises :class:`SessionError` when that is refused."""
    if not isinstance(job_id, str):  # a WorkerAllocation, SlurmAllocation or AllocationSnapshot
        job_id = getattr(job_id, "job_id", None) or getattr(job_id, "slurm_job_id", job_id)
    job_id = str(job_id)
    if key is not None:
        check_key(key)
    for _attempt in range(5):
        doc = session.io.read().doc
        decided = wt.assign_worker_intent(doc, job_id=job_id, intent=key)
        if isinstance(decided, tr.Refused):
            raise SessionError(f"assign_worker_intent({job_id!r}, {key!r}): {decided.reason}")
        if session.io.apply(decided).ok:
            return
    raise SessionError(f"assign_worker_intent({job_id!r}, {key!r}): the worker record kept "
                       "changing meanwhile; call again")


def reconcile_workers(session: SessionContext, intent: WorkerIntent,
                      observed: SessionSnapshot | None = None,
                      release: Sequence[str] | None = None,
                      max_submissions: int | None = None,
                      max_observation_age: float = DEFAULT_MAX_OBSERVATION_AGE,
                      logger: Any = None) -> ReconcileResult:
    """Submit or release allocations of ``intent`` until its count holds; see the module
    docstring and :meth:`RunSession.reconcile_workers`."""
    from dagster_slurm.launchers.ray import RayLauncher

    if not isinstance(intent, WorkerIntent):
        raise SessionError(f"reconcile_workers needs a WorkerIntent, got {intent!r}")
    names = check_release(release)
    budget = check_budget(max_submissions)
    if not isinstance(session.launcher, RayLauncher):
        raise SessionError(
            f"the run session {session.job_name} uses {type(session.launcher).__name__}; "
            "worker allocations join a Ray cluster, so the session's launcher must be a "
            "RayLauncher (default_launcher=RayLauncher(...))")
    out = ProgressLog(logger)
    owner = lease.new_owner_id()
    observation = _take_lease(session, owner, out)
    try:
        doc = observation.doc
        now = float(observation.now or session.clock())
        snapshot = build_snapshot(doc, observation.status, observation.files, session.paths)
        plan = plan_reconcile(intent, snapshot, now, observed=observed,
                              max_observation_age=max_observation_age, release=names,
                              max_submissions=budget, grace=policy.DRAIN_GRACE)
        steps, roles = _steps(session, intent, plan, doc, owner)
    except BaseException:
        _give_back(session, owner)
        raise
    try:
        outcomes = session.io.act(steps)
    except BaseException:
        _give_back(session, owner)  # over a new connection when the old one dropped
        raise
    result = _result(plan, roles, outcomes)
    _log(out, session, intent, result)
    return result


# -- the lease -----------------------------------------------------------------------------------
def _take_lease(session: SessionContext, owner: str, out: ProgressLog) -> Any:
    previous: Mapping[str, Any] | None = None
    started = time.monotonic()
    said = ""
    while True:
        observation = session.io.observe(
            lease.acquire_patch(RECONCILE_LEASE, owner, RECONCILE_LEASE_TTL, previous))
        if observation.lease_ok:
            return observation
        leases = (observation.lease_doc or {}).get("leases") or {}
        record = leases.get(RECONCILE_LEASE) if isinstance(leases, Mapping) else None
        now = observation.now if observation.now is not None else float("inf")
        holder = lease.current_holder(observation.lease_doc, RECONCILE_LEASE, now)
        if holder is None:
            previous = record  # expired (or malformed): take it over on the next try
            if record is not None:
                continue
        waited = time.monotonic() - started
        if waited > LEASE_WAIT:
            raise LockTimeout(
                f"reconcile_workers waited {waited:.0f} s for the session's reconcile lease "
                f"(held by {holder.owner if holder else 'another process'}); call again")
        now_said = (f"reconcile_workers waits for another process of the run "
                    f"({holder.owner if holder else 'unknown'}) to finish its reconciliation")
        if now_said != said:
            out.info(now_said)
            said = now_said
        # A busy lease costs one transaction per try, never a scheduler query.
        session.pause(LEASE_POLL + random.uniform(0.0, LEASE_POLL), "the session's reconcile lease")


def _give_back(session: SessionContext, owner: str) -> None:
    try:
        session.io.act([Txn(tuple(lease.release_patch(RECONCILE_LEASE, owner)), "lease")])
    except Exception:  # the lease expires by itself
        pass


# -- the steps -----------------------------------------------------------------------------------
def _guarded(owner: str, patch: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return (*lease.fence_patch(RECONCILE_LEASE, owner), *patch)


class _Batch:
    """The steps of one act round trip, each with its role: (what, job id or token)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.steps: list[Step] = []
        self.roles: list[tuple[str, str]] = []

    def add(self, step: Step, role: str, subject: str) -> int:
        self.steps.append(step)
        self.roles.append((role, subject))
        return len(self.steps) - 1

    def change(self, outcome: tr.Outcome, role: str, subject: str) -> int | None:
        """The transition's patch, guarded by the lease; None when it was refused."""
        if not isinstance(outcome, tr.Change):
            return None
        return self.add(Txn(_guarded(self.owner, outcome.patch), outcome.transition), role,
                        subject)


def _steps(session: SessionContext, intent: WorkerIntent, plan: ReconcilePlan,
           doc: SessionDocument | None, owner: str) -> tuple[list[Step], list[tuple[str, str]]]:
    """The batch of ``plan``, and each step's role."""
    batch = _Batch(owner)
    for token, job_id in plan.found:
        batch.change(wt.settle_worker_found(doc, token=token, job_id=job_id), "found", job_id)
    for token in plan.lost:
        batch.change(wt.settle_worker_lost(doc, token=token), "lost", token)
    for job_id, state in plan.ended:
        batch.change(wt.release_worker(doc, job_id=job_id, final_state=state), "ended", job_id)
    for item in plan.releases:
        persisted = batch.change(wt.request_worker_drain(
            doc, job_id=item.job_id, deadline=item.deadline, intent=intent.key),
            "released", item.job_id)
        if persisted is None:
            continue
        if item.pending:
            batch.add(Cancel((item.job_id,), after=persisted), "cancelled", item.job_id)
        else:
            batch.add(_drain(session, item.job_id, item.deadline, persisted), "drain",
                      item.job_id)
    for item in plan.redrain:
        batch.add(_drain(session, item.job_id, item.deadline, None), "drain", item.job_id)
    if plan.cancel:
        batch.add(Cancel(tuple(plan.cancel)), "cancelled", ",".join(plan.cancel))
    if plan.submit:
        resolved = _resolved(session, intent, doc)
        for _ in range(plan.submit):
            batch.add(_submission(session, intent, resolved, owner), "submitted", "")
    batch.add(Txn(tuple(lease.release_patch(RECONCILE_LEASE, owner)), "lease"), "lease", owner)
    return batch.steps, batch.roles


def _drain(session: SessionContext, job_id: str, deadline: float, after: int | None) -> Signal:
    text = f"deadline={int(deadline)}\n"
    return Signal(job_id, REMOVAL_SIGNAL, {session.paths.worker_drain(job_id): (text, 0o600)},
                  after=after)


def _resolved(session: SessionContext, intent: WorkerIntent,
              doc: SessionDocument | None) -> SlurmWorkerAllocationConfig:
    from dagster_slurm.session.core.worker_config import resolve_worker_config
    from dagster_slurm.session.workers.submit import first_worker

    return resolve_worker_config(intent.config or SlurmWorkerAllocationConfig(),
                                 first_worker(doc), session.queue)


def _submission(session: SessionContext, intent: WorkerIntent,
                resolved: SlurmWorkerAllocationConfig, owner: str) -> Submit:
    from dagster_slurm.session.workers.submit import prepare_worker_submission

    token = new_token()
    spec, files, snapshot, shape = prepare_worker_submission(session, resolved, token)
    return submit_request(
        session, None, spec=spec, files=files, token=token,
        record=f"{wt.SUBMISSIONS}/{token}",
        record_value=wt.worker_submission_record(snapshot, shape, intent.key, reconciled=True),
        on_submitted=(f"{wt.WORKERS}/{{job_id}}",
                      wt.worker_record_value(snapshot, intent.key, reconciled=True)),
        fence=Fence(RECONCILE_LEASE, owner))


# -- the answer ----------------------------------------------------------------------------------
def _result(plan: ReconcilePlan, roles: list[tuple[str, str]],
            outcomes: Sequence[StepOutcome]) -> ReconcileResult:
    done: dict[str, list[str]] = {}
    held = list(plan.held_back)
    for (role, subject), outcome in zip(roles, outcomes, strict=True):
        if outcome.ok or (role == "cancelled" and outcome.gone):
            if role == "submitted" and outcome.job_id:
                subject = outcome.job_id
            for job_id in subject.split(","):
                if job_id:
                    done.setdefault(role, []).append(job_id)
        elif role == "lease":
            continue  # taken over after it expired: nothing after that step was applied
        elif role == "submitted":
            held.append(_refused_submission(outcome.error))
        elif role == "drain" and outcome.gone:
            continue  # it ended meanwhile: recorded released by the next call
        elif not outcome.skipped:
            held.append(f"{role} {subject} was not applied: {outcome.error}")
    live = tuple(dict.fromkeys((*[j for j in plan.live if j not in done.get("released", [])],
                                *done.get("submitted", []))))
    return ReconcileResult(
        submitted=tuple(done.get("submitted", ())), released=tuple(done.get("released", ())),
        live=live, held_back=tuple(held), recovered=tuple(done.get("found", ())),
        cancelled=tuple(dict.fromkeys(done.get("cancelled", ()))),
        ended=tuple(done.get("ended", ())))


def _refused_submission(error: str | None) -> str:
    """The held-back sentence of a submission sbatch refused: a limit on queued jobs is a
    wait (the next call submits again once a job has ended), anything else a failure."""
    refusal = classify_refusal(error or "")
    if refusal is not None and refusal.kind is RefusalKind.WAIT:
        return (f"a submission waits for a free slot under the submission limit "
                f"{refusal.field} (sbatch: {refusal.code}); a later call submits it once a "
                "job of the user has ended")
    if refusal is not None:
        return f"a submission failed: {error} ({refusal.advice})"
    return f"a submission failed: {error}"


def _log(out: ProgressLog, session: SessionContext, intent: WorkerIntent,
         result: ReconcileResult) -> None:
    parts = [f"{len(result.live)} live"]
    for name in ("submitted", "released", "cancelled", "recovered", "ended"):
        ids = getattr(result, name)
        if ids:
            parts.append(f"{name} {', '.join(ids)}")
    line = (f"Worker intent {intent.key!r} (count {intent.count}) of {session.job_name}: "
            + "; ".join(parts)
            + ("" if not result.held_back else "; held back: " + " / ".join(result.held_back)))
    failed = any(h.startswith("a submission failed") for h in result.held_back)
    (out.warning if failed else out.info)(line)
