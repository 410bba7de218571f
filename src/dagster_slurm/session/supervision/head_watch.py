"""Every step process keeps an eye on the run's Ray head once the session has worker
allocations (or a separate head): :class:`HeadWatch`.

A session without worker allocations never elects a head on its own (its steps fail with
:class:`~dagster_slurm.session.core.errors.SlurmAllocationEnded` and the application calls
``replace_head()``). With worker allocations, the Ray cluster outlives its head: every
process that uses the session checks the head every
:data:`~dagster_slurm.state.election.HEAD_CHECK_INTERVAL` seconds (one document read and one
squeue, in :func:`decide`), and

* elects a new head at once (``replace_head``; one process wins the claim, the others wait
  for its head) when the head's job ended, its Ray stopped while the job runs, or it drains
  (for a head hosted by a worker allocation: that allocation drains);
* drains the head itself (``request_drain()``) when it gets no pre-walltime signal and no
  more than :data:`~dagster_slurm.state.election.HANDOVER_LEAD` seconds of its walltime are
  left, so that it hands over before it ends; a worker allocation that hosts the head is
  removed instead (drained to end shortly before its walltime), which moves the head to
  another host first;
* otherwise, for a session laid out with worker allocations (a separate head), submits the
  first worker allocation again when none is left
  (:func:`~dagster_slurm.session.workers.keep.keep_a_worker`).

A process that started before the session's first worker allocation was added reads the
document every :data:`~dagster_slurm.state.election.WORKER_DISCOVERY_INTERVAL` seconds and
begins checking within that time. Nothing is done on an unknown: a scheduler that does not
answer, or a document that cannot be read, is tried again at the next check.

The watch runs in a daemon thread started with the session's heartbeat and stopped with it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.protocol import WALLTIME_MARGIN_SECONDS
from dagster_slurm.session.head.election import replace_head, scheduler_view
from dagster_slurm.session.workers.keep import keep_a_worker
from dagster_slurm.session.workers.removal import remove_worker_allocation
from dagster_slurm.state.election import (
    HEAD_CHECK_INTERVAL,
    WORKER_DISCOVERY_INTERVAL,
    HeadChoiceKind,
    SchedulerView,
    choose_head,
    head_drain_due,
    hosting_worker_drains,
)
from dagster_slurm.state.election_transitions import WORKER_HEAD_KIND

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext
    from dagster_slurm.state.schema import SessionDocument

log = logging.getLogger("dagster_slurm.session")


class WatchAction(str, Enum):
    """What one check of the head decided."""

    IDLE = "idle"
    """The session has no worker allocation and no separate head: nothing to watch."""
    KEEP = "keep"
    """The head is healthy, or someone else elects, or the answer was uncertain."""
    DRAIN = "drain"
    """The head has no pre-walltime signal and its walltime is near: drain it."""
    ELECT = "elect"
    """The head is gone, its Ray stopped, or it drains: elect a new one."""


@dataclass(frozen=True)
class WatchDecision:
    """:class:`WatchAction` with the reason in words, and the head's job id (None when
    there is none)."""

    action: WatchAction
    reason: str
    head: str | None = None


def watched(doc: SessionDocument | None, separate_head: bool) -> bool:
    """True when the session's head is watched: it has a worker allocation recorded (live
    or not: a session whose workers all left still elects) or a separate head."""
    return separate_head or (doc is not None and bool(doc.workers))


def decide(doc: SessionDocument | None, view: SchedulerView, now: float, *,
           separate_head: bool, has_signal: bool, port_strategy: str = "random",
           hosts_on_workers: bool = True) -> WatchDecision:
    """One check of the head (pure): see the module docstring. ``has_signal``: the head
    gets a pre-walltime signal (its effective ``signal_before_timeout`` is set)."""
    if doc is None or doc.closed or not watched(doc, separate_head):
        return WatchDecision(WatchAction.IDLE, "no worker allocation and no separate head")
    head = str(doc.allocation.job_id) if doc.allocation and doc.allocation.job_id else None
    hosted = doc.allocation is not None and doc.allocation.kind == WORKER_HEAD_KIND
    if (head_drain_due(doc, view, now, has_signal=has_signal)
            and not hosting_worker_drains(doc)):
        what = (f"worker allocation {head}, which hosts the head," if hosted
                else f"the head allocation (job {head})")
        return WatchDecision(WatchAction.DRAIN, f"{what} gets no pre-walltime signal and its "
                             "walltime is near", head)
    choice = choose_head(doc, view, now, port_strategy=port_strategy,
                         hosts_on_workers=hosts_on_workers)
    if choice.kind in (HeadChoiceKind.KEEP, HeadChoiceKind.WAIT, HeadChoiceKind.CLOSED):
        return WatchDecision(WatchAction.KEEP, choice.reason, head)
    return WatchDecision(WatchAction.ELECT, choice.reason, head)


class HeadWatch(threading.Thread):
    """The head check of one process's session (a daemon thread); see the module
    docstring."""

    def __init__(self, session: SessionContext, logger: Any = None) -> None:
        super().__init__(name=f"dagster-slurm-head-watch-{session.job_name}", daemon=True)
        self.session = session
        self.logger = logger
        self._stop_event = threading.Event()
        # a separate head is watched from the start; otherwise the first worker is awaited
        self.interval = (HEAD_CHECK_INTERVAL if session.separate_head
                         else WORKER_DISCOVERY_INTERVAL)

    def check_once(self) -> WatchDecision:
        """One check, acted upon; returns the decision."""
        session = self.session
        separate = session.separate_head
        doc = session.io.read().doc
        if not watched(doc, separate):
            self.interval = WORKER_DISCOVERY_INTERVAL
            return WatchDecision(WatchAction.IDLE, "no worker allocation and no separate head")
        self.interval = HEAD_CHECK_INTERVAL
        doc, view, now = scheduler_view(session)
        signal = None
        if doc is not None and doc.allocation is not None:
            signal = (doc.allocation.config or {}).get("signal_before_timeout")
        decision = decide(doc, view, now, separate_head=separate,
                          has_signal=bool(signal or session.queue.signal_before_timeout),
                          port_strategy=str(getattr(session.launcher, "port_strategy",
                                                    "random")))
        if decision.action is WatchAction.DRAIN:
            log.info("draining the head of %s: %s", session.job_name, decision.reason)
            if doc is not None and doc.allocation is not None \
                    and doc.allocation.kind == WORKER_HEAD_KIND:
                self._hand_over(decision, view, now)
            else:
                session.ensure(self.logger).request_drain()
        elif decision.action is WatchAction.ELECT:
            log.warning("the head of %s must be replaced: %s", session.job_name, decision.reason)
            replace_head(session, logger=self.logger)
        elif separate:
            # a session laid out with worker allocations gets one again when none is left
            keep_a_worker(session, self.logger, observed=(doc, view))
        return decision

    def _hand_over(self, decision: WatchDecision, view: SchedulerView, now: float) -> None:
        """Drain the worker allocation that hosts the head so that it finishes
        :data:`~dagster_slurm.protocol.WALLTIME_MARGIN_SECONDS` seconds before its
        walltime; its removal moves the head first (in a background thread, like
        ``remove_worker_allocation(wait=False)``)."""
        assert decision.head is not None
        job = view.jobs.get(decision.head)
        end_at = job.end_at if job is not None else None
        left = 0.0 if end_at is None else max(0.0, end_at - now - WALLTIME_MARGIN_SECONDS)
        remove_worker_allocation(self.session, decision.head, drain_timeout=left, wait=False,
                                 logger=self.logger)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.check_once()
            except DagsterSlurmError as exc:  # an unknown: checked again next time
                log.warning("head check of %s failed: %s", self.session.job_name, exc)
            except Exception:  # noqa: BLE001 - never kill the process over a check
                log.exception("head check of %s failed", self.session.job_name)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)
