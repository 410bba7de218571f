"""The reconcile planner (pure): examples of each rule, and properties over random snapshots.

Properties (hypothesis, random members, submissions and observations):

* never more than ``count`` committed allocations of the intent after the plan, unless
  allocations that may not be released (the head's host, in-flight submissions) already
  exceed it, and then nothing is submitted;
* never a release of an allocation of another intent (or none), of the head's host, or of
  one whose drain deadline is persisted (its deadline never moves);
* never a submission on an uncertain or stale observation, for a closed session, or past
  the budget; nothing at all is decided when the scheduler did not answer.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_slurm.session.scaling.intents import WorkerIntent
from dagster_slurm.session.scaling.plan import (
    DRAIN_GRACE,
    SETTLE_AFTER,
    ReconcilePlan,
    plan_reconcile,
)
from dagster_slurm.session.scaling.snapshot import (
    ENDED,
    AllocationSnapshot,
    SessionSnapshot,
    SubmissionSnapshot,
)

NOW = 1_800_000_000.0
KEY = "gpu"


def worker(job_id: str, state: str | None = "RUNNING", *, intent: str | None = KEY,
           time_left: float | None = 3000.0, submitted_at: float | None = None,
           drain_deadline: float | None = None, hosts_head: bool = False,
           worker_state: str | None = "joined") -> AllocationSnapshot:
    committed = None if state is None else state in ("RUNNING", "PENDING", "CONFIGURING")
    return AllocationSnapshot(
        slurm_job_id=job_id, role="worker", state=state, reason=None,
        time_left_seconds=time_left if state == "RUNNING" else None, time_limit_seconds=3600.0,
        requested_nodes=1, requested_gpus_per_node=1, tres=None, granted_gpus=None,
        nodes=("g1",) if state == "RUNNING" else (), ray_nodes={}, ready=False,
        draining=drain_deadline is not None, intent=intent, drain_deadline=drain_deadline,
        submitted_at=submitted_at, committed=committed, worker_state=worker_state,
        hosts_head=hosts_head)


def snap(*workers: AllocationSnapshot, certain: bool = True, at: float = NOW,
         head: str | None = "10", submissions: tuple[SubmissionSnapshot, ...] = (),
         closed: bool = False) -> SessionSnapshot:
    return SessionSnapshot(observed_at=at, certain=certain, head=None, successor=None,
                           allocations=tuple(workers), submissions=submissions,
                           head_job_id=head, closed=closed,
                           error=None if certain else "Unable to contact slurm controller")


def intent(count: int, **kw: object) -> WorkerIntent:
    return WorkerIntent(key=KEY, count=count, **kw)  # type: ignore[arg-type]


def released(plan: ReconcilePlan) -> set[str]:
    return {r.job_id for r in plan.releases}


# -- examples -----------------------------------------------------------------------------------
def test_scale_out_counts_pending_and_running_and_ignores_other_intents() -> None:
    s = snap(worker("21"), worker("22", "PENDING"), worker("23", intent=None),
             worker("24", intent="other"))
    plan = plan_reconcile(intent(4), s, NOW)
    assert plan.submit == 2 and plan.live == ("21", "22") and not plan.releases


def test_scale_in_releases_pending_first_then_the_least_time_left() -> None:
    s = snap(worker("21", time_left=900), worker("22", time_left=100), worker("23", "PENDING"),
             worker("24", time_left=50, hosts_head=True))
    plan = plan_reconcile(intent(2, drain_timeout=60), s, NOW)
    order = [(r.job_id, r.pending) for r in plan.releases]
    assert order == [("23", True), ("22", False)]
    assert plan.releases[1].deadline == NOW + 60 and plan.releases[0].deadline == NOW
    assert set(plan.live) == {"21", "24"} and plan.submit == 0


def test_an_uncertain_observation_decides_nothing() -> None:
    s = snap(worker("21", None), worker("22", None, drain_deadline=NOW - 999), certain=False)
    plan = plan_reconcile(intent(5), s, NOW, release=("21",))
    assert (plan.submit, plan.releases, plan.cancel, plan.ended, plan.found) == (0, (), (), (), ())
    assert "did not answer" in plan.held_back[0] and "Unable to contact" in plan.held_back[0]


def test_stale_or_other_head_observation_submits_nothing_but_releases_continue() -> None:
    s = snap(worker("21"), worker("22"))
    old = snap(at=NOW - 301)
    plan = plan_reconcile(intent(1), s, NOW, observed=old)
    assert released(plan) == {"22"} or released(plan) == {"21"}
    plan = plan_reconcile(intent(5), s, NOW, observed=old)
    assert plan.submit == 0 and "301 s old" in plan.held_back[0]
    plan = plan_reconcile(intent(5), s, NOW, observed=snap(head="9"))
    assert plan.submit == 0 and "head changed" in plan.held_back[0]
    assert plan_reconcile(intent(5), s, NOW, observed=snap(at=NOW - 10)).submit == 3


def test_the_budget_and_a_closed_session_hold_submissions_back() -> None:
    plan = plan_reconcile(intent(4), snap(), NOW, max_submissions=1)
    assert plan.submit == 1 and "max_submissions=1" in plan.held_back[0]
    assert plan_reconcile(intent(4), snap(), NOW, max_submissions=0).submit == 0
    plan = plan_reconcile(intent(4), snap(closed=True), NOW)
    assert plan.submit == 0 and "closed" in plan.held_back[0]


def test_pending_timeout_cancels_and_does_not_replace_in_the_same_call() -> None:
    s = snap(worker("21", "PENDING", submitted_at=NOW - 121),
             worker("22", "PENDING", submitted_at=NOW - 60),
             worker("23", "PENDING", submitted_at=None))  # joined the intent later: no timer
    plan = plan_reconcile(intent(3, pending_timeout=120), s, NOW)
    assert [(r.job_id, r.pending, r.deadline) for r in plan.releases] == [("21", True, NOW)]
    assert plan.submit == 0 and "pending_timeout=120" in plan.held_back[0]
    # the next call, once 21 ended: replaced
    later = snap(worker("21", "CANCELLED", drain_deadline=NOW),
                 worker("22", "PENDING", submitted_at=NOW - 61), worker("23", "PENDING"))
    plan = plan_reconcile(intent(3, pending_timeout=120), later, NOW + 1)
    assert plan.ended == (("21", "CANCELLED"),) and plan.submit == 1


def test_named_releases_apply_first_and_count_then_applies_to_the_others() -> None:
    s = snap(worker("21", time_left=9000), worker("22", time_left=10), worker("23"))
    plan = plan_reconcile(intent(2), s, NOW, release=("21", "99", "23"))
    assert released(plan) == {"21", "23"} and plan.submit == 1
    # already released (deadline persisted): ignored, the deadline stays
    s = snap(worker("21", drain_deadline=NOW + 50), worker("22"))
    plan = plan_reconcile(intent(1), s, NOW, release=("21",))
    assert not plan.releases and plan.submit == 0


def test_a_passed_deadline_cancels_after_the_grace_and_an_unseen_drain_is_resent() -> None:
    s = snap(worker("21", drain_deadline=NOW - DRAIN_GRACE),
             worker("22", drain_deadline=NOW + 100, worker_state="joined"),
             worker("23", drain_deadline=NOW + 100, worker_state="draining"),
             worker("24", drain_deadline=NOW - 5))
    plan = plan_reconcile(intent(0), s, NOW)
    assert plan.cancel == ("21",)
    assert [(r.job_id, r.deadline) for r in plan.redrain] == [("22", NOW + 100)]
    assert not plan.releases


def test_ended_members_are_recorded_with_their_state_or_none() -> None:
    s = snap(worker("21", "COMPLETED"), worker("22", ENDED), worker("23"))
    plan = plan_reconcile(intent(2), s, NOW)
    assert plan.ended == (("21", "COMPLETED"), ("22", None)) and plan.submit == 1


def test_interrupted_submissions_are_found_counted_or_settled_lost() -> None:
    subs = (SubmissionSnapshot("t-found", "submitting", KEY, NOW - 5, "31"),
            SubmissionSnapshot("t-young", "submitting", KEY, NOW - 5, None),
            SubmissionSnapshot("t-old", "unknown", KEY, NOW - SETTLE_AFTER, None),
            SubmissionSnapshot("t-failed", "failed", KEY, NOW - 5, None),
            SubmissionSnapshot("t-other", "submitting", None, NOW - 5, None))
    plan = plan_reconcile(intent(3), snap(submissions=subs), NOW)
    assert plan.found == (("t-found", "31"),) and plan.lost == ("t-old",)
    assert plan.in_flight == 1 and plan.submit == 1 and plan.live == ("31",)


def test_drain_timeout_none_drains_until_the_walltime() -> None:
    s = snap(worker("21", time_left=1000), worker("22", time_left=math.inf))
    plan = plan_reconcile(intent(0, drain_timeout=None), s, NOW)
    assert {r.job_id: r.deadline for r in plan.releases} == {"21": NOW + 985, "22": NOW + 600}


# -- properties ---------------------------------------------------------------------------------
STATES = st.sampled_from(["RUNNING", "PENDING", "COMPLETED", "CANCELLED", ENDED, None])


# The strategies the composites draw from, built once (a strategy built anew for every draw
# is validated again by Hypothesis each time).
_JOB_NUMBER = st.integers(20, 60)
_INTENT = st.sampled_from([KEY, KEY, "other", None])
_TIME_LEFT = st.one_of(st.none(), st.floats(0, 10_000))
_SUBMITTED_AT = st.one_of(st.none(), st.floats(NOW - 1000, NOW))
_DRAIN_DEADLINE = st.one_of(st.none(), st.floats(NOW - 200, NOW + 200))
_WORKER_STATE = st.sampled_from(["joined", "draining", "waiting", None])
_SUBMISSION_STATUS = st.sampled_from(["submitting", "unknown", "failed"])
_SUBMISSION_KEY = st.sampled_from([KEY, None])
_SUBMISSION_AT = st.floats(NOW - 400, NOW)
_SUBMISSION_JOBS = [st.sampled_from([None, str(70 + i)]) for i in range(4)]
_SUBMISSIONS = st.integers(0, 3)
_HEAD = st.sampled_from(["10", "11"])


@st.composite
def members(draw: st.DrawFn) -> AllocationSnapshot:
    job_id = str(draw(_JOB_NUMBER))
    state = draw(STATES)
    return worker(
        job_id, state, intent=draw(_INTENT),
        time_left=draw(_TIME_LEFT),
        submitted_at=draw(_SUBMITTED_AT),
        drain_deadline=draw(_DRAIN_DEADLINE),
        hosts_head=draw(st.booleans()),
        worker_state=draw(_WORKER_STATE))


_MEMBERS = st.lists(members(), max_size=8)


@st.composite
def snapshots(draw: st.DrawFn) -> SessionSnapshot:
    found = {}
    for w in draw(_MEMBERS):
        found[w.slurm_job_id] = w
    certain = draw(st.booleans())
    workers = [w if certain else dataclasses.replace(w, state=None, committed=None)
               for w in found.values()]
    subs = tuple(SubmissionSnapshot(f"t{i}", draw(_SUBMISSION_STATUS),
                                    draw(_SUBMISSION_KEY),
                                    draw(_SUBMISSION_AT),
                                    draw(_SUBMISSION_JOBS[i]) if certain
                                    else None)
                 for i in range(draw(_SUBMISSIONS)))
    return snap(*workers, certain=certain, submissions=subs, closed=draw(st.booleans()),
                head=draw(_HEAD))


def _committed_after(s: SessionSnapshot, plan: ReconcilePlan) -> int:
    return len(plan.live) + plan.in_flight + plan.submit


@settings(max_examples=400, deadline=None)
@given(snapshots(), st.integers(0, 6), st.one_of(st.none(), st.integers(0, 3)),
       st.one_of(st.none(), st.floats(0, 500)), st.lists(st.sampled_from(
           [str(i) for i in range(20, 61)]), max_size=3),
       st.one_of(st.none(), st.floats(NOW - 600, NOW)), st.sampled_from(["10", "11"]))
def test_properties_of_every_plan(s: SessionSnapshot, count: int, budget: int | None,
                                  pending_timeout: float | None, named: list[str],
                                  observed_at: float | None, observed_head: str) -> None:
    wi = intent(count, pending_timeout=pending_timeout)
    observed = None if observed_at is None else snap(at=observed_at, head=observed_head)
    plan = plan_reconcile(wi, s, NOW, observed=observed, release=tuple(named),
                          max_submissions=budget)
    by_id = {w.slurm_job_id: w for w in s.allocations}
    for item in plan.releases:
        w = by_id[item.job_id]
        assert w.intent == KEY, "released an allocation of another intent (or none)"
        assert not w.hosts_head, "released the head's host"
        assert w.drain_deadline is None, "moved a persisted deadline"
        assert item.deadline >= NOW
    for item in plan.redrain:
        assert item.deadline == by_id[item.job_id].drain_deadline
    for job_id in (*plan.cancel, *(j for j, _ in plan.ended)):
        assert by_id[job_id].intent == KEY
    if not s.certain:
        assert plan == ReconcilePlan(live=plan.live, in_flight=plan.in_flight,
                                     held_back=plan.held_back)
    if plan.submit:
        assert s.certain and not s.closed
        assert observed is None or (NOW - observed_at <= 300  # type: ignore[operator]
                                    and observed.head_job_id == s.head_job_id)
        assert budget is None or plan.submit <= budget
        assert _committed_after(s, plan) <= count, "more than count committed"
        # an allocation cancelled for pending too long still counts in this call: it is
        # not replaced by one of this call's submissions
        expired = sum(r.reason.startswith("pending longer") for r in plan.releases)
        assert _committed_after(s, plan) + expired <= count, "replaced a pending-too-long one"
    if s.certain and _committed_after(s, plan) < count:
        assert plan.held_back, "short of count without a reason"
    if s.certain:
        keep = [w for w in s.allocations if w.intent == KEY and w.drain_deadline is None
                and ((w.hosts_head and w.committed) or w.committed is None)]
        assert _committed_after(s, plan) - len([r for r in plan.releases
                                                 if r.reason.startswith("pending longer")]) \
            <= max(count, len(keep) + plan.in_flight + len(plan.found)), plan
    assert plan.submit == 0 or plan.held_back == () or any(
        "max_submissions" in h or "pending" in h or "hosts" in h for h in plan.held_back)
