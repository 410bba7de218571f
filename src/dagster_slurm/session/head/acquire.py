"""Acquiring the run's head allocation: attach to the one the session document names, or
submit one, and wait until it accepts steps.

* **Exactly one allocation.** A process that finds no ``/allocation`` record submits through
  the guarded submission (:mod:`~dagster_slurm.session.core.submission`) on the pointer
  ``/allocation``: the record (with the process's token) is written under the lock only if
  absent, then sbatch runs. Every other process gets a conflict and waits for the record's
  job id; a record of a dead submitter is settled by the token in squeue's comment column
  after :data:`SUBMIT_GRACE_SECONDS`.
* **Reattachment.** A process (a retried step, a restarted supervisor) that finds a live
  allocation attaches to it; an allocation that ended after it had accepted steps is moved
  to ``/history/<job id>`` and replaced; one that ended before it accepted any step fails
  the step with the allocation's log tail (no resubmission loop).

Nothing here holds a lock while it waits: the caller installs the result in
:class:`~dagster_slurm.session.core.current.CurrentAllocation`, and a session closed while
this waits ends the wait (:class:`SessionError`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.errors import SlurmJobUnschedulable, SlurmSubmissionError
from dagster_slurm.jobs.logs import ProgressLog, notable_lines
from dagster_slurm.jobs.signals import drain_signal_of
from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.protocol import FAILED_RECORD_SECONDS, SUBMIT_GRACE_SECONDS
from dagster_slurm.scheduler.client import new_token
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.session.core.allocation import SlurmAllocation
from dagster_slurm.session.core.context import SessionContext, heartbeat_line
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.readiness import ENDED, ReadyWatch
from dagster_slurm.session.core.step_server import render_server
from dagster_slurm.session.core.submission import (
    SubmitOutcome,
    guarded_submit,
    refuse,
    submit_request,
)
from dagster_slurm.session.head.successor import refuse_new_head
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import Allocation

log = logging.getLogger("dagster_slurm.session")

__all__ = [
    "FAILED_RECORD_SECONDS", "SUBMIT_GRACE_SECONDS", "acquire_head", "new_allocation", "submit_head",
]


def new_allocation(session: SessionContext, job_id: str, nodes: tuple[str, ...],
                   values: Mapping[str, Any],
                   config: Mapping[str, Any] | None = None) -> SlurmAllocation:
    """The default allocation object of ``job_id`` (``RunSession.make_allocation``): its
    drain signal is the one of ``config`` (the allocation's recorded configuration; None
    or empty: the session's)."""
    signal = (config or {}).get("signal_before_timeout") or session.queue.signal_before_timeout
    return SlurmAllocation(
        session.io.scheduler, session.paths, session.job_name, job_id,  # type: ignore[arg-type]
        nodes=nodes, head=values.get("head") or None,
        ray_address=values.get("ray_address") or None,
        drain_signal=drain_signal_of(signal) or "TERM",
        poll_interval=session.poll_interval, clock=session.clock, sleep=session.sleep,
    )


def acquire_head(session: SessionContext, out: ProgressLog) -> SlurmAllocation:
    """Attach to the head allocation the document names, or submit one; see the
    transitions of :mod:`dagster_slurm.state.transitions` for each state's edge."""
    waiting = PollBackoff(initial=0.2, maximum=0.5, factor=1.25)
    while True:
        session.current.check_open()
        read = session.io.read()
        doc = read.doc
        if doc is not None and doc.closed:
            raise SessionError(tr.closed_message(doc, session.job_name))
        state = tr.head_state(doc)
        record = doc.allocation if doc is not None else None
        if state is tr.HeadState.ABSENT:
            if doc is not None:
                refuse_new_head(session, doc)  # an outstanding successor: promote it
            job_id, mine = submit_head(session, out, doc)
            if job_id is None:
                session.pause(waiting.observe(False), "the run allocation's submission")
                continue
            allocation = _await_ready(session, job_id, out, mine)
            if allocation is not None:
                return allocation
            continue
        assert record is not None
        if state in (tr.HeadState.SUBMITTED, tr.HeadState.READY, tr.HeadState.DRAINING):
            allocation = _await_ready(session, str(record.job_id), out, False)
            if allocation is not None:
                return allocation
            continue
        if state is tr.HeadState.SUBMITTING:
            age = read.now - float(record.submitted_at or read.now)
            if age < SUBMIT_GRACE_SECONDS:
                session.pause(waiting.observe(False), "the run allocation's submission")
                continue
            _settle_in_doubt(session, record, out)
            continue
        finished = float(record.finished_at or record.submitted_at or 0)
        if read.now - finished < FAILED_RECORD_SECONDS:
            raise SlurmSubmissionError(
                f"the run allocation could not be submitted ({record.status}): "
                f"{(record.error or '').strip()}"
            )
        session.retire(record.token, "token", record.status)


def submit_head(session: SessionContext, out: ProgressLog,
                doc: Any = None) -> tuple[str | None, bool]:
    """Submit the head allocation without waiting for it: its job id and True; the job id
    and False for a submission of this token recovered from squeue; ``(None, False)`` when
    another process is submitting (or the session was closed meanwhile). ``doc``: the
    session document the caller read (None: only the guards decide)."""
    token = new_token()
    decided = tr.submit_head(doc, token=token, config=session.config.snapshot(),
                             job_name=session.job_name)
    refuse(decided)  # before the environment is prepared for the script
    submit_dir = session.paths.submit_dir(token)
    script, server = f"{submit_dir}/allocation.sh", f"{submit_dir}/step_server.sh"
    plan = ExecutionPlan(
        payload=("bash", server), job_dir=submit_dir, status_file=f"{submit_dir}/exit_status",
        drain_file=f"{submit_dir}/drain_signal", mode="slurm", activation=session.activation(),
        num_nodes=session.spec.num_nodes or 1, drain_signal=session.drain_signal,
    )
    spec = dataclasses.replace(session.spec, script_path=script)
    request = submit_request(
        session, decided, spec=spec, token=token,
        files={
            script: (session.head_launcher.render(plan), 0o600),
            server: (render_server(session.paths, token, session.drain_signal,
                                   session.config.heartbeat_timeout), 0o600),
            session.paths.heartbeat: (heartbeat_line(), 0o600),
        },
        record_value=tr.head_submission_record(session.config.snapshot()))
    result = guarded_submit(session, request, "", out)
    if result.outcome is not SubmitOutcome.SUBMITTED or result.job is None:
        return None, False  # another record, or closed meanwhile: read the document again
    job = result.job
    if job.recovered:
        return job.job_id, False
    out.info(
        f"Submitted run allocation {job.job_id} ({session.job_name}, partition "
        f"{spec.partition or 'default'}, {spec.num_nodes or 1} node(s), time limit "
        f"{spec.time_limit}{', starts Ray' if session.has_ray else ''}); session files in "
        f"{session.paths.session_dir}"
    )
    return job.job_id, True


def _await_ready(session: SessionContext, job_id: str, out: ProgressLog,
                 mine: bool) -> SlurmAllocation | None:
    """Wait until allocation ``job_id`` accepts steps. None: it had ended after serving
    steps (retired; the caller submits anew). Raises when it fails before that; an
    allocation this process submitted is cancelled when waiting for it fails."""
    watch = ReadyWatch(session, job_id, out)
    try:
        while True:
            session.current.check_open()
            values = watch.poll()
            if values is ENDED:
                return None
            if values is not None:
                return _attached(session, job_id, values, out, mine)
            session.pause(watch.delay, f"run allocation {job_id}")
    except SlurmJobUnschedulable:
        session.cancel_quietly(job_id, out)
        session.retire(job_id, "job_id", "CANCELLED")
        raise
    except SessionError:
        if mine or watch.running_since is not None:
            session.cancel_quietly(job_id, out)
        raise
    except BaseException:
        if mine:
            session.cancel_quietly(job_id, out)
        raise


def _attached(session: SessionContext, job_id: str, values: dict[str, Any], out: ProgressLog,
              mine: bool) -> SlurmAllocation:
    nodes = tuple(session.io.read_lines(session.paths.nodes(job_id)))
    allocation = session.make_allocation(job_id, nodes, values, session.recorded_config(job_id))
    verb = "accepts steps" if mine else "found; attaching to it"
    out.info(
        f"Run allocation {job_id} {verb} (nodes {','.join(nodes) or '?'}"
        + (f", Ray at {allocation.ray_address}" if allocation.ray_address else "") + ")"
    )
    if mine:
        for line in notable_lines(session.log_tail(job_id, 200)):
            out.info(line)
        change = tr.record_ready(None, job_id=job_id, nodes=nodes,
                                 ray_address=allocation.ray_address)
        try:
            assert isinstance(change, tr.Change)
            if not session.io.apply(change).ok:
                log.warning("did not record the nodes of allocation %s: the session no "
                            "longer has it as its head", job_id)
        except DagsterSlurmError as exc:
            log.warning("could not record the allocation's nodes: %s", exc)
    return allocation


def _settle_in_doubt(session: SessionContext, record: Allocation, out: ProgressLog) -> None:
    """A ``submitting`` record whose submitter vanished: find its job by token."""
    token = record.token
    if token is None:
        session.retire(None, "token", "unknown")
        return
    snapshot = session.io.queue([session.job_name])
    for job_id, queued in snapshot.queue.items():
        if queued.comment == token:
            change = tr.settle_found(None, token=token, job_id=job_id)
            assert isinstance(change, tr.Change)
            session.io.apply(change)
            out.info(f"Recovered run allocation {job_id} of an interrupted submission")
            return
    session.retire(token, "token", "unknown")
