"""Successor allocations: queue the run's next allocation, then promote it to the head.

:meth:`RunSession.submit_successor` and :meth:`RunSession.promote_successor` call
:func:`submit_successor` and :func:`promote_successor` here.

* **Submission** returns once sbatch answered. The successor carries the session's job name
  (teardown's ``scancel --name`` ends it, pending or running) and its batch script is a
  standby (``templates/successor_standby.sh``): once running it starts nothing until it is
  promoted. Fields the caller did not set inherit the current allocation's configuration,
  except ``extra_sbatch_directives`` (one submission's; empty unless given). Only one
  successor is outstanding: its record is ``/successor`` of the session document, so a
  process started later (another step, a restarted supervisor) finds it, also after its
  predecessor ended. While it is outstanding and the session has no live head (the
  predecessor ended before the promotion), a step that asks for the session's allocation
  gets a :class:`SessionError` naming the successor and its state instead of a new head
  allocation (:func:`refuse_new_head`): promoting it is the application's decision.
* **Promotion** requires a RUNNING successor and no unfinished step of the predecessor
  (requested but not yet started by srun included). It writes the allocation's start
  script, rendered now by the recorded launcher (or ``launcher``) with the recorded
  environment (or ``activation_script``), and waits until the successor's step server
  accepts steps (Ray started), without holding the session's lock. Then, under the lock, it
  checks again: both allocations are still the ones it began with, the successor still runs
  and the predecessor has no unfinished step (one admitted while Ray started fails the
  promotion until it finishes; calling again is cheap, the successor is already started).
  It then publishes the successor as the head (the predecessor goes to the history as
  ``REPLACED``: a step prepared against it is refused with
  :class:`~dagster_slurm.session.core.errors.SlurmAllocationEnded`), updates the run tag
  ``dagster-slurm/allocation`` and cancels the predecessor. Calling it again after a
  completed promotion publishes the tag and cancels the predecessor again, nothing else; the
  tag is never set back from an allocation promoted later, whose steps tag the run with it
  (:mod:`dagster_slurm.session.head.run_tag`).
* **A drain before promotion.** The standby records the drain signal (Slurm's pre-walltime
  signal, or ``scancel --signal``) in ``jobs/<job id>/drained`` and keeps waiting. Promotion
  of such a successor goes ahead (its Ray cluster starts, it becomes the head, the
  predecessor is released) and logs a warning; as in any drained allocation, every step
  started in it returns a drained outcome without running (draining is permanent), so the
  caller's relay loop queues the next successor.
* **Waiting for a queued successor.** ``promote_successor(wait=seconds)`` first waits until
  the successor runs, logging its pending reason and start estimate; a drained predecessor
  with no unfinished step is released meanwhile, since the successor may need its nodes
  (:mod:`dagster_slurm.session.head.handover`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from dagster_slurm.errors import ConfigurationError, DagsterSlurmError
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.jobs.signals import drain_signal_of
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.scheduler.client import StatusSnapshot, new_token
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import PromotionDeferred, SessionError
from dagster_slurm.session.core.job_handle import SessionJob
from dagster_slurm.session.core.readiness import ENDED, ReadyWatch
from dagster_slurm.session.core.step_server import render_server
from dagster_slurm.session.core.submission import (
    SubmitOutcome,
    guarded_submit,
    refuse,
    submit_request,
)
from dagster_slurm.session.head.handover import await_running, release_allocation
from dagster_slurm.session.head.layout import head_request
from dagster_slurm.session.head.run_tag import publish_promoted
from dagster_slurm.session.head.standby import render_standby
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import successor_transitions as st
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import Allocation, SessionDocument

if TYPE_CHECKING:
    from dagster_slurm.session.core.allocation import SlurmAllocation
    from dagster_slurm.session.core.context import SessionContext

log = logging.getLogger("dagster_slurm.session")

#: Run tag holding the job id of the run's current allocation.


class SuccessorAllocation(SessionJob):
    """A queued successor: ``job_id`` (also ``slurm_job_id``), its submission ``token``,
    the full ``config`` it was submitted with (inherited fields filled in) and the head it
    was queued behind (``predecessor``, a job id)."""

    def __init__(self, session: SessionContext, job_id: str, token: str,
                 config: SlurmRunAllocationConfig, predecessor: str) -> None:
        super().__init__(session, job_id, token)
        self.config = config
        self.predecessor = predecessor

    def __repr__(self) -> str:
        return f"SuccessorAllocation(job_id={self.job_id!r}, predecessor={self.predecessor!r})"


def inherit_config(current: Mapping[str, Any], given: SlurmRunAllocationConfig) -> SlurmRunAllocationConfig:
    """``given`` completed by ``current`` (the current allocation's configuration snapshot):
    every field the caller did not set takes the current value, except
    ``extra_sbatch_directives``, which is ``given``'s (empty unless set). The result has
    ``given``'s class (a subclass of :class:`SlurmRunAllocationConfig` keeps its own fields;
    keys of ``current`` that class does not know are dropped). Raises
    :class:`ConfigurationError` naming the field when the combination is invalid."""
    cls = type(given)
    known = cls.model_fields
    values = {key: value for key, value in current.items() if key in known}
    for name in given.model_fields_set:
        values[name] = getattr(given, name)
    values["extra_sbatch_directives"] = list(given.extra_sbatch_directives)
    try:
        return cls(**values)
    except ValidationError as exc:  # a combination of given and inherited values
        for detail in exc.errors():
            cause = (detail.get("ctx") or {}).get("error")
            if isinstance(cause, ConfigurationError):
                raise ConfigurationError(
                    cause.field, cause.value,
                    f"{cause.problem} (fields of the successor's configuration left unset "
                    "take the current allocation's values; set them explicitly)") from None
        raise ConfigurationError(
            "config", given.snapshot(),
            f"does not combine with the inherited fields "
            f"{sorted(set(values) - given.model_fields_set)}: {exc}; set them explicitly",
        ) from None


# -- submission --------------------------------------------------------------------------------
def submit_successor(session: SessionContext, config: SlurmRunAllocationConfig,
                     logger: Any = None) -> SuccessorAllocation:
    """Queue the session's successor; see the module docstring."""
    out = ProgressLog(logger)
    doc = _open_document(session)
    if doc.successor is not None and not _settle_outstanding(session, doc.successor):
        raise SessionError(st.outstanding_message(doc.successor))
    doc = _open_document(session)
    head = doc.allocation
    if head is None or not head.job_id or tr.head_state(doc) not in (
            tr.HeadState.SUBMITTED, tr.HeadState.READY, tr.HeadState.DRAINING):
        raise SessionError(
            f"the run session {session.job_name} has no current allocation to queue a "
            "successor behind (it has not been submitted yet, or it ended); use the session "
            "(session.allocation) to get one")
    merged = session.clone_allocation_config(head.config or session.config.snapshot(), config)
    predecessor = str(head.job_id)
    token = new_token()
    decided = st.submit_successor(doc, token=token, config=merged.snapshot(),
                                  predecessor=predecessor, job_name=session.job_name)
    refuse(decided)
    spec, files = _submission(session, merged, token)
    request = submit_request(
        session, decided, spec=spec, files=files, token=token,
        record_value=st.successor_submission_record(merged.snapshot(), predecessor),
        record=st.SUCCESSOR, guards=st.successor_guards(predecessor))
    result = guarded_submit(session, request, "the successor allocation", out)
    if result.outcome is SubmitOutcome.IN_DOUBT:
        raise SessionError(_outstanding_now(session))
    if result.failure is not None:
        raise SessionError(
            f"while the successor was being submitted the session {session.job_name} was "
            f"closed or its allocation {predecessor} was replaced: {result.failure.outcome()}")
    job = result.job
    assert job is not None
    if job.recovered:
        raise SessionError(_outstanding_now(session))
    out.info(f"Submitted successor allocation {job.job_id} of run allocation {predecessor} "
             f"({session.job_name}, time limit {spec.time_limit}); it waits for "
             "promote_successor() once it runs")
    return SuccessorAllocation(session, job.job_id, token, merged, predecessor)


def _submission(session: SessionContext, config: SlurmRunAllocationConfig,
                token: str) -> tuple[Any, dict[str, tuple[str | bytes, int]]]:
    """The successor's sbatch request and files (standby script, step server)."""

    paths = session.paths
    submit_dir = paths.submit_dir(token)
    script = f"{submit_dir}/allocation.sh"
    queue = head_request(config, session.slurm.queue, session.layout)  # a separate head's own
    spec = queue.to_sbatch_spec(session.job_name, script, output=paths.output,
                                error=paths.output, chdir=paths.session_dir,
                                **config.sbatch_options())
    drain = drain_signal_of(queue.signal_before_timeout) or "TERM"
    timeout = config.heartbeat_timeout
    standby = render_standby(paths, token, drain, timeout)
    files: dict[str, tuple[str | bytes, int]] = {
        script: (standby, 0o600),
        f"{submit_dir}/step_server.sh": (render_server(paths, token, drain, timeout), 0o600),
    }
    return spec, files


def _open_document(session: SessionContext) -> SessionDocument:
    doc = session.io.read().doc
    if doc is None:
        raise SessionError(f"the run session {session.job_name} has no allocation yet; use "
                           "the session (session.allocation) first")
    if doc.closed:
        raise SessionError(tr.closed_message(doc, session.job_name))
    return doc


def _outstanding_now(session: SessionContext) -> str:
    doc = session.io.read().doc
    if doc is not None and doc.successor is not None:
        return st.outstanding_message(doc.successor)
    return "another process submitted a successor at the same time; read the session again"


def _settle_outstanding(session: SessionContext, record: Allocation,
                        snapshot: StatusSnapshot | None = None) -> bool:
    """True when the outstanding successor ``record`` is over (it ended, or its submission
    failed) and was moved to the history; False while it may still run. ``snapshot``: a
    squeue of the session's job name already made (None: one is made when needed)."""
    state: str | None = None
    if record.status == "failed":
        state = "failed"
    elif record.status == "submitted" and record.job_id:
        snapshot = snapshot or session.io.queue([session.job_name])
        state = snapshot.ended_state(str(record.job_id))
    if state is None or record.token is None:
        return False
    decided = st.retire_successor(session.io.read().doc, token=record.token, final_state=state)
    return isinstance(decided, tr.Change) and session.io.apply(decided).ok


def refuse_new_head(session: SessionContext, doc: SessionDocument) -> None:
    """Called before a new head allocation would be submitted (the session has none that
    lives): raises :class:`SessionError` while a successor is outstanding, naming its job
    id and scheduler state and saying to promote it. Which allocation the run continues in
    is the application's decision (``promote_successor()``), never a step's side effect. A
    successor that is over (ended, or its submission failed) is moved to the history and
    the caller goes on to submit."""
    record = doc.successor
    if record is None:
        return
    snapshot = None
    if record.status == "submitted" and record.job_id:
        snapshot = session.io.queue([session.job_name])
    if _settle_outstanding(session, record, snapshot):
        return
    raise SessionError(_head_refused_message(session, record, snapshot))


def _head_refused_message(session: SessionContext, record: Allocation,
                          snapshot: StatusSnapshot | None) -> str:
    if record.job_id:
        which = f"job {record.job_id}"
        if snapshot is None or not snapshot.certain:
            state = "state unknown: the scheduler did not answer" + (
                f" ({snapshot.error})" if snapshot is not None and snapshot.error else "")
        else:
            observed = snapshot.job(str(record.job_id))
            state = observed.state.value if observed.state is not None else "not listed by squeue"
            if observed.reason and observed.state is not JobState.RUNNING:
                state += f", reason {observed.reason}"
    else:
        which, state = f"token {record.token}", f"submission {record.status}"
    when = ("now" if snapshot is not None and snapshot.certain
            and snapshot.job(str(record.job_id)).state is JobState.RUNNING
            else "once it is RUNNING")
    return (f"the run session {session.job_name} has no live allocation (its allocation "
            f"ended) and an outstanding successor, {which} ({state}); no new allocation is "
            f"submitted while a successor is outstanding: promote it {when} with "
            "session.promote_successor() and use the session again (or cancel the successor "
            "to have the next use submit a new allocation)")


# -- promotion ---------------------------------------------------------------------------------
def promote_successor(session: SessionContext, launcher: ComputeLauncher | None = None,
                      activation_script: str | None = None, logger: Any = None,
                      wait: float | None = None) -> SlurmAllocation:
    """Make the running successor the session's allocation; see the module docstring.
    ``wait``: seconds to wait for a queued successor to start first
    (:func:`~dagster_slurm.session.head.handover.await_running`); None: it must run already."""
    out = ProgressLog(logger)
    doc = _open_document(session)
    record = doc.successor
    if record is None:
        return _repair(session, doc, out)
    if record.status != "submitted" or not record.job_id:
        raise SessionError(
            f"the successor's submission is {record.status}"
            + (f": {record.error.strip()}" if record.error else "")
            + "; it cannot be promoted")
    job_id, predecessor = str(record.job_id), _predecessor(doc)
    if wait is not None:
        await_running(session, job_id, predecessor, doc, wait, out)
    _check(session, job_id, predecessor)
    values = _start(session, record, launcher, activation_script, out)
    doc = _open_document(session)
    head = doc.allocation
    if doc.successor is None and head is not None and head.job_id == job_id:
        return _repair(session, doc, out)  # another process promoted it meanwhile
    if doc.successor is None or doc.successor.job_id != job_id or _predecessor(doc) != predecessor:
        raise SessionError("the session's allocations changed while the successor started; "
                           "call promote_successor() again")
    _check(session, job_id, predecessor, during_startup=True)
    nodes = tuple(session.io.read_lines(session.paths.nodes(job_id)))
    ray_address = values.get("ray_address") or None
    decided = st.promote_successor(doc, job_id=job_id, predecessor=predecessor,
                                   nodes=nodes, ray_address=ray_address)
    if isinstance(decided, tr.Refused):
        raise SessionError(decided.reason)
    if not session.io.apply(decided).ok:
        raise SessionError("the session document changed while the successor was "
                           "promoted; call promote_successor() again")
    allocation = session.make_allocation(job_id, nodes, values, record.config)
    session.current.install(allocation)
    out.info(f"Promoted successor allocation {job_id}"
             + (f" (replacing {predecessor})" if predecessor else "")
             + f" (nodes {','.join(nodes) or '?'}"
             + (f", Ray at {ray_address}" if ray_address else "") + ")")
    if values.get("drained"):
        out.warning(f"The successor allocation {job_id} was drained ({values['drained']}) "
                    "before its promotion: its steps return drained outcomes without running; "
                    "submit another successor for the remaining work")
    _finish(session, job_id, predecessor, out)
    return allocation


def _predecessor(doc: SessionDocument) -> str | None:
    """The head's job id (None: there is no head record). Raises for a head that is not a
    submitted job (a submission in flight or failed: nothing to promote over)."""
    head = doc.allocation
    if head is None:
        return None
    if tr.head_state(doc) in (tr.HeadState.SUBMITTED, tr.HeadState.READY, tr.HeadState.DRAINING):
        return str(head.job_id)
    raise SessionError(f"the session's head allocation is {tr.head_state(doc).value} "
                       f"(token {head.token}); promote once it is settled")


def _check(session: SessionContext, job_id: str, predecessor: str | None,
           *, during_startup: bool = False) -> None:
    """Raise unless the successor runs and the predecessor has no unfinished step."""
    snapshot = session.io.queue([session.job_name])
    if not snapshot.certain:
        raise PromotionDeferred(f"the scheduler did not answer ({snapshot.error}); the "
                                f"successor {job_id} was not promoted")
    observed = snapshot.job(job_id)
    ended = snapshot.ended_state(job_id)
    if ended is not None:
        raise SessionError(f"the successor allocation {job_id} ended ({ended}) before its "
                           "promotion; submit another with submit_successor()")
    if observed.state is not JobState.RUNNING:
        state = observed.state.value if observed.state is not None else "not listed by squeue"
        reason = f", reason {observed.reason}" if observed.reason else ""
        raise SessionError(f"the successor allocation {job_id} is {state}{reason}: "
                           "promote_successor() requires a RUNNING successor; call it again "
                           "once the scheduler started it")
    if predecessor is not None:
        _check_idle(session, snapshot, predecessor, during_startup)


def _check_idle(session: SessionContext, snapshot: StatusSnapshot, predecessor: str,
                during_startup: bool) -> None:
    observed = snapshot.job(predecessor)
    if snapshot.ended_state(predecessor) is not None or (
            observed.state is not None and not observed.state.active):
        return  # the predecessor has ended: none of its steps runs any more
    steps = session.io.active_steps(predecessor)
    if steps:
        when = " (admitted while the successor started)" if during_startup else ""
        raise PromotionDeferred(
            f"the predecessor allocation {predecessor} still has {len(steps)} active payload "
            f"step(s){when}: {'; '.join(steps)}. promote_successor() requires that none runs "
            "or waits for srun: wait until they returned (request_drain() makes them finish "
            "at their next safe boundary), then call it again")


def _start(session: SessionContext, record: Allocation, launcher: ComputeLauncher | None,
           activation_script: str | None, out: ProgressLog) -> dict[str, Any]:
    """Start the successor's allocation script (once) and wait until its step server
    accepts steps; the values of its ready file. Holds no lock of the session."""
    from dagster_slurm.session.core.allocation import parse_ready

    job_id, token = str(record.job_id), str(record.token)
    polled = session.io.poll_ready(session.job_name, job_id, with_status=False)
    if polled.ready is None:
        submit_dir = session.paths.submit_dir(token)
        config = record.config or session.config.snapshot()
        queue = head_request(SlurmRunAllocationConfig(**{
            k: v for k, v in config.items() if k in SlurmRunAllocationConfig.model_fields}),
            session.slurm.queue, session.layout)
        chosen = launcher or session.head_launcher
        activation = activation_script if activation_script is not None else session.activation()
        plan = ExecutionPlan(
            payload=("bash", f"{submit_dir}/step_server.sh"), job_dir=submit_dir,
            status_file=f"{submit_dir}/exit_status", drain_file=f"{submit_dir}/drain_signal",
            mode="slurm", activation=activation, num_nodes=queue.num_nodes or 1,
            drain_signal=drain_signal_of(queue.signal_before_timeout) or "TERM",
        )
        script = f"{submit_dir}/promoted-{uuid.uuid4().hex[:8]}.sh"
        session.io.write_files({script: (chosen.render(plan), 0o600),
                                f"{submit_dir}/start": (script + "\n", 0o600)})
        out.info(f"Starting successor allocation {job_id}"
                 + (" (starting Ray)" if _is_ray(chosen) else ""))
    else:
        return parse_ready(polled.ready)
    watch = ReadyWatch(session, job_id, out)
    while True:
        values = watch.poll()
        if values is ENDED:
            raise SessionError(f"the successor allocation {job_id} ended while it started")
        if values is not None:
            return values
        session.pause(watch.delay, f"successor allocation {job_id}")


def _is_ray(launcher: ComputeLauncher) -> bool:
    from dagster_slurm.launchers.ray import RayLauncher

    return isinstance(launcher, RayLauncher)


def _repair(session: SessionContext, doc: SessionDocument, out: ProgressLog) -> SlurmAllocation:
    """promote_successor() without an outstanding successor: after a completed promotion,
    publish the tag and release the predecessor again; otherwise there is nothing to do."""
    head = doc.allocation
    if head is None or not head.job_id or "promoted_from" not in head.model_fields_set:
        raise SessionError(f"the run session {session.job_name} has no successor to promote; "
                           "submit one with submit_successor() first")
    _finish(session, str(head.job_id), head.promoted_from, out)
    return session.ensure(out.logger)


def _finish(session: SessionContext, job_id: str, predecessor: str | None, out: ProgressLog) -> None:
    """Publish the run tag of ``job_id`` and cancel the ``predecessor`` unless a step still
    runs in it (one admitted in the moment between the last check and the publication;
    best effort: both are repeated by calling promote_successor() again)."""
    publish_promoted(session, job_id, out)
    if predecessor is None:
        return
    try:
        snapshot = session.io.queue([session.job_name])
        observed = snapshot.job(predecessor)
        if observed.state is None or not observed.state.active:
            return
        late = session.io.active_steps(predecessor)
        if late:  # admitted between the last check and the publication: never cut off
            out.warning(f"The predecessor allocation {predecessor} is kept for now: "
                        f"{'; '.join(late)} started in it just before the promotion; "
                        "promote_successor() releases it once they finished (teardown "
                        "cancels it in any case)")
            return
        release_allocation(session, predecessor)
        out.info(f"Released the predecessor allocation {predecessor}")
    except DagsterSlurmError as exc:
        out.error(f"could not release the predecessor allocation {predecessor}: {exc}; call "
                  f"promote_successor() again or run `scancel {predecessor}`")
