"""One observation and one batch of actions on a run session, each in one SSH round trip.

``inspect()`` and ``reconcile_workers()`` talk to the cluster through two calls of
:class:`~dagster_slurm.session.core.io.SessionIO`:

* ``observe(lease_patch)``: optionally a transaction (``reconcile_workers`` takes its lease
  there; when it fails the scheduler is not asked), then the agent's ``observe_session`` (the session document, one ``squeue`` for the
  session's job name, ``sacct`` for known jobs that left the queue, the small files of
  every known job and the session's ``ray_head``), in one round trip: an
  :class:`Observation`.
* ``act(steps)``: a list of :class:`Txn`, :class:`Signal`, :class:`Cancel` and
  :class:`Submit` steps run in their order in one round trip; a step with ``after`` runs
  only when the step at that index succeeded (so a drain is sent only once its deadline is
  persisted). One :class:`StepOutcome` per step.

:func:`agent_observe` and :func:`agent_act` are the cluster implementations (over the
session's :class:`~dagster_slurm.SlurmResource`); unit tests give the session an in-memory
equivalent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster_slurm.agent import exec_op, observe_session_op, submit_op, write_file_op
from dagster_slurm.agent.ops import AgentOp
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.slurm.commands import (
    SbatchSpec,
    sacct_base_argv,
    sbatch_argv,
    scancel_argv,
    squeue_observe_argv,
)
from dagster_slurm.state.schema import SessionDocument
from dagster_slurm.state.store import AgentStateStore
from dagster_slurm.state.transitions import document

Files = Mapping[str, tuple[str | bytes, int]]

#: Files of every known job read by an observation (names under ``jobs/<job id>/``).
JOB_FILES: tuple[str, ...] = ("nodes", "ray_nodes", "state")

#: Words of scancel's message when the job it should signal or cancel has ended.
JOB_GONE = ("Invalid job id", "already completing or completed", "Job has already finished")


def job_gone(message: str) -> bool:
    """scancel's ``message`` says the job it should signal or cancel has ended."""
    return any(words in message for words in JOB_GONE)


@dataclass(frozen=True)
class Observation:
    """One look at the session: ``doc`` (None before it exists), the scheduler's answer,
    the files read (path -> text, None when missing), the login node's clock ``now``, and
    whether the transaction sent with it (``lease_ok``) committed (None: none was sent)."""

    doc: SessionDocument | None
    status: StatusSnapshot
    files: Mapping[str, str | None]
    now: float | None
    lease_ok: bool | None = None
    lease_doc: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Txn:
    """Apply ``patch`` under the session lock."""

    patch: tuple[Mapping[str, Any], ...]
    label: str
    after: int | None = None


@dataclass(frozen=True)
class Signal:
    """Write ``files``, then ``scancel --batch --signal=<signal> <job_id>``."""

    job_id: str
    signal: str
    files: Files = dataclasses.field(default_factory=dict)
    after: int | None = None


@dataclass(frozen=True)
class Cancel:
    """``scancel`` the jobs."""

    job_ids: tuple[str, ...]
    after: int | None = None


@dataclass(frozen=True)
class Submit:
    """The agent's token-recorded ``submit`` of ``spec`` (its ``comment`` is the token),
    after writing ``files``; see :meth:`~dagster_slurm.session.core.io.SessionIO.submit`."""

    spec: SbatchSpec
    files: Files
    token: str
    record: str
    record_value: Mapping[str, Any]
    on_submitted: tuple[str, Mapping[str, Any]] | None
    guards: tuple[Mapping[str, Any], ...]
    create: Mapping[str, Any]
    after: int | None = None


Step = Txn | Signal | Cancel | Submit


@dataclass(frozen=True)
class StepOutcome:
    """How one step went: ``ok``; ``skipped`` when its ``after`` step failed; ``gone`` for a
    signal or cancel whose job had ended; ``job_id`` of a submission; ``error`` otherwise."""

    ok: bool
    skipped: bool = False
    gone: bool = False
    job_id: str | None = None
    error: str | None = None
    doc: Mapping[str, Any] | None = None


def agent_observe(slurm: Any, paths: SessionPaths, job_name: str, initial: Mapping[str, Any],
                  lease_patch: Sequence[Mapping[str, Any]] | None = None) -> Observation:
    """:class:`Observation` through the cluster-side agent of ``slurm`` (one round trip)."""
    scheduler = slurm.scheduler()
    store = AgentStateStore(slurm.agent(), paths.session_dir, initial=initial)
    with scheduler.agent.batch() as batch:
        lease = batch.add(store.txn_op(list(lease_patch))) if lease_patch is not None else None
        observed = batch.add(observe_session_op(
            paths.document, squeue_observe_argv([job_name], version=scheduler.version),
            sacct_argv=sacct_base_argv(version=scheduler.version),
            jobs_dir=f"{paths.session_dir}/jobs", job_files=JOB_FILES, files=[paths.ray_head]),
            requires=[lease] if lease is not None else [])
    now = batch.response.now if batch.response else None
    lease_ok = lease_doc = None
    if lease is not None:
        txn = lease.result()
        lease_ok, lease_doc = txn.ok, txn.doc
        if not txn.ok:  # another process holds the lease: the scheduler is not asked
            return Observation(document(txn.doc, job_name), unobserved(now), {}, now, False,
                               txn.doc)
    result = observed.result()
    status = scheduler.snapshot(result.status, now)
    files = {path: (f.data if f.exists else None) for path, f in result.files.items()}
    return Observation(document(result.doc, job_name), status, files, now, lease_ok, lease_doc)


def unobserved(now: float | None) -> StatusSnapshot:
    """The scheduler's answer when it was not asked (an uncertain, empty snapshot)."""
    return StatusSnapshot(now, False, {}, {}, {}, (), "not asked: the lease is held elsewhere")


def agent_act(slurm: Any, paths: SessionPaths, initial: Mapping[str, Any],
              steps: Sequence[Step]) -> list[StepOutcome]:
    """Run ``steps`` through the cluster-side agent of ``slurm`` (one round trip)."""
    scheduler = slurm.scheduler()
    store = AgentStateStore(slurm.agent(), paths.session_dir, initial=initial)
    with scheduler.agent.batch() as batch:
        main: list[Any] = []
        for step in steps:
            requires = [main[step.after]] if step.after is not None else []
            main.append(_add(batch, store, paths, step, requires))
    outcomes = [_outcome(step, handle, scheduler) for step, handle in zip(steps, main, strict=True)]
    return outcomes


def _add(batch: Any, store: AgentStateStore, paths: SessionPaths, step: Step,
         requires: list[Any]) -> Any:
    if isinstance(step, Txn):
        return batch.add(store.txn_op(list(step.patch)), requires=requires)
    if isinstance(step, Cancel):
        return batch.add(exec_op(scancel_argv(list(step.job_ids)), timeout=60), requires=requires)
    written = [batch.add(write_file_op(path, content, mode=mode, makedirs=True),
                         requires=requires)
               for path, (content, mode) in step.files.items()]
    needs = written or requires
    if isinstance(step, Signal):
        return batch.add(exec_op(scancel_argv([step.job_id], signal=step.signal,
                                              batch_only=True), timeout=60), requires=needs)
    spec = dataclasses.replace(step.spec, comment=step.token)
    op: AgentOp[Any] = submit_op(
        sbatch_argv(spec), token=step.token, state_path=paths.document, lock_path=paths.lock,
        record=step.record, record_value=step.record_value, create=dict(step.create),
        guards=list(step.guards), on_submitted=step.on_submitted)
    return batch.add(op, requires=needs)


def _outcome(step: Step, handle: Any, scheduler: Any) -> StepOutcome:
    raw = handle.raw or {}
    if raw.get("skipped"):
        return StepOutcome(False, skipped=True, error=str((raw.get("error") or {}).get("message")))
    if isinstance(step, Txn):
        result = handle.result()
        return StepOutcome(result.ok, doc=result.doc,
                           error=None if result.ok else f"conflict: {result.conflict}")
    if isinstance(step, Signal | Cancel):
        scheduler.stats.count("scancel")
        try:
            result = handle.result()
        except Exception as exc:  # the op itself failed (scancel could not run)
            return StepOutcome(False, error=str(exc))
        if result.rc == 0:
            return StepOutcome(True)
        message = (result.stderr or result.stdout).strip()
        if job_gone(message):
            return StepOutcome(False, gone=True, error=message)
        return StepOutcome(False, error=message or f"exit code {result.rc}")
    scheduler.stats.count("sbatch")
    if not raw.get("ok"):
        error = raw.get("error") or {}
        return StepOutcome(False, job_id=raw.get("job_id"),
                           error=f"{error.get('type')}: {error.get('message')}")
    result = handle.result()
    return StepOutcome(result.ok, job_id=result.job_id, doc=result.doc,
                       error=None if result.ok else (result.stderr or result.status))
