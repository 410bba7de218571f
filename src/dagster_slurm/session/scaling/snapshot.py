"""One observation of a run session: :meth:`RunSession.inspect` returns a :class:`SessionSnapshot`.

A snapshot combines, as of one moment, the session document (what the library recorded:
intents, drain deadlines, submissions), the scheduler's answer for every allocation of the
session (one ``squeue`` by the session's job name, ``sacct`` for known jobs that left the
queue) and the small files the batch scripts write (``nodes``, ``ray_nodes``, ``state``,
``drain`` of every worker allocation, the session's ``ray_head``). The cluster-side agent
gathers all of it in one round trip (``observe_session``); :func:`build_snapshot` here turns
it into typed values without any I/O, so every rule below is tested without a cluster.

Values that could not be observed are None, never 0 or False: when the scheduler did not
answer, every ``state`` (and what depends on it) is None and ``certain`` is False. A job the
scheduler no longer lists reports its final state from accounting, or :data:`ENDED` when
accounting has no record of it either.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from dagster_slurm.protocol import WORKER_DRAINING
from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state.schema import Allocation, SessionDocument, Submission, Worker

#: The state of a job that left the queue without an accounting record saying how it ended.
ENDED = "ENDED"

_GPU_TRES = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")
_GPU_TOTAL = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_OPEN = ("submitting", "unknown")


@dataclass(frozen=True)
class AllocationSnapshot:
    """One allocation of the session as observed (see :class:`SessionSnapshot`).

    Scheduler facts are None when the scheduler did not answer (or, for a job that left the
    queue, when they no longer apply); bookkeeping fields come from the session document.
    """

    slurm_job_id: str
    """The Slurm job id."""
    role: str
    """``head`` (the allocation hosting the run's Ray head and step server), ``successor``
    (queued or running, not yet promoted) or ``worker``."""
    state: str | None
    """The scheduler's state name (``PENDING``, ``RUNNING``, ...); for a job no longer in the
    queue its accounting state, or :data:`ENDED`; None when not observed."""
    reason: str | None
    """The scheduler's pending reason (``Resources``, ``Priority``...); None when there is
    none or it was not observed."""
    time_left_seconds: float | None
    """Remaining walltime of a running job, as the scheduler counts it (follows time limit
    changes; ``math.inf`` when unlimited); None unless the job runs."""
    time_limit_seconds: float | None
    """The job's current time limit as the scheduler reports it; None when not observed."""
    requested_nodes: int | None
    """Nodes asked for (the recorded configuration, else the scheduler's count)."""
    requested_gpus_per_node: int | None
    """GPUs per node asked for; None when the configuration does not say."""
    tres: str | None
    """The trackable resources the scheduler reports (``cpu=4,mem=8G,node=1,gres/gpu=2``):
    the grant once the job runs, the request before; None when not observed."""
    granted_gpus: int | None
    """GPUs the scheduler granted the job, over all its nodes, read from ``tres`` while it
    runs (0: it runs without GPUs); None unless the job runs and ``tres`` was observed."""
    nodes: tuple[str, ...] | None
    """The allocation's Slurm nodes (``()`` while pending); None when not observed."""
    ray_nodes: Mapping[str, str] | None
    """Worker allocations: Slurm node -> Ray node id of each node that joined the current
    Ray head (``{}`` before any did); None for head and successor allocations."""
    ready: bool | None
    """Worker allocations: every node joined the current Ray head; the head: its step server
    accepts steps; None when not known (a RUNNING job is not yet a ready worker)."""
    draining: bool | None
    """A drain was requested (its deadline persisted, or the batch script reports it)."""
    intent: str | None
    """Worker allocations: the key of the :class:`~dagster_slurm.session.scaling.intents.WorkerIntent`
    that owns it; None when none does (e.g. added with ``add_worker_allocation``)."""
    drain_deadline: float | None
    """Worker allocations: the persisted drain deadline (login node epoch seconds); the job is
    cancelled once it (plus a grace period) passes. None unless it is being released."""
    submitted_at: float | None
    """Login node epoch seconds when ``reconcile_workers`` submitted it; None for every
    other allocation (including one that joined an intent later)."""
    committed: bool | None
    """The job is pending or holds its allocation and is not released: it counts toward its
    intent unless it drains. None when its state is not known."""
    released: bool = False
    """The session recorded the allocation as released (it left the session)."""
    worker_state: str | None = None
    """Worker allocations: the batch script's state word (``waiting``, ``joined``,
    ``partial``, ``draining``, ``released <why>``); None before it wrote one."""
    hosts_head: bool = False
    """Worker allocations: it hosts the run's Ray head (it was elected)."""


@dataclass(frozen=True)
class SubmissionSnapshot:
    """A submission recorded under its token whose job id the session has not recorded."""

    token: str
    status: str
    """``submitting`` (sbatch may be running), ``unknown`` (sbatch did not answer) or
    ``failed``."""
    intent: str | None
    submitted_at: float | None
    """Login node epoch seconds when the submission was recorded."""
    found_job_id: str | None
    """The job squeue lists with this token in its comment; None when none is listed (or
    the scheduler did not answer)."""


@dataclass(frozen=True)
class SessionSnapshot:
    """One observation of every allocation of a run session (see the module docstring)."""

    observed_at: float | None
    """The login node's clock at the scheduler query (epoch seconds), so that processes on
    different hosts compare the same time; None when unknown."""
    certain: bool
    """The scheduler answered; when False every ``state`` is None."""
    head: AllocationSnapshot | None
    """The head allocation; None before the session has one."""
    successor: AllocationSnapshot | None
    """A published successor not yet promoted; None without one."""
    allocations: tuple[AllocationSnapshot, ...] = ()
    """Every live (not released) worker allocation, oldest job first."""
    submissions: tuple[SubmissionSnapshot, ...] = ()
    """Worker submissions whose job id is not recorded (in flight or interrupted)."""
    error: str | None = None
    """The scheduler's error when it did not answer."""
    document_version: int = 0
    """The session document's version at the observation."""
    head_job_id: str | None = None
    """The job id of the head at the observation (also when ``head`` could not be read)."""
    closed: bool = False
    """The session is closed: nothing is submitted for it any more."""
    queue_tokens: Mapping[str, str] = field(default_factory=dict)
    """Submission token -> job id of every job squeue listed for the session's job name."""

    def workers(self, key: str | None = None) -> tuple[AllocationSnapshot, ...]:
        """The live worker allocations; with ``key``, only those of that intent."""
        if key is None:
            return self.allocations
        return tuple(w for w in self.allocations if w.intent == key)

    def worker(self, job_id: str) -> AllocationSnapshot | None:
        """The live worker allocation with ``job_id``, None when there is none."""
        return next((w for w in self.allocations if w.slurm_job_id == job_id), None)

    def age(self, now: float) -> float | None:
        """Seconds from the observation to ``now`` (login node clock); None when unknown."""
        return None if self.observed_at is None else now - self.observed_at


def build_snapshot(doc: SessionDocument | None, status: StatusSnapshot,
                   files: Mapping[str, str | None], paths: SessionPaths) -> SessionSnapshot:
    """The :class:`SessionSnapshot` of one observation: the document as read, the scheduler's
    answer and the files read (path -> text, None when missing). Pure."""
    if doc is None:
        return SessionSnapshot(status.observed_at, status.certain, None, None,
                               error=status.error)
    head_job = _ray_head_job(files.get(paths.ray_head)) or (
        doc.allocation.job_id if doc.allocation is not None else None)
    hosted = doc.allocation.job_id if doc.allocation is not None and (
        doc.allocation.kind == "worker") else None
    head = _head(doc.allocation, "head", status) if doc.allocation is not None else None
    successor = _head(doc.successor, "successor", status) if (
        doc.successor is not None and doc.successor.job_id) else None
    workers = tuple(
        _worker(record, status, files, paths, head_job, record.job_id == hosted)
        for record in sorted(doc.workers.values(), key=lambda w: (len(w.job_id), w.job_id))
        if not record.released)
    tokens = {rec.comment: job_id for job_id, rec in status.queue.items()
              if rec.comment} if status.certain else {}
    submissions = tuple(
        SubmissionSnapshot(token, sub.status, sub.intent, sub.submitted_at, tokens.get(token))
        for token, sub in sorted(doc.worker_submissions.items())
        if _unsettled(sub, doc))
    return SessionSnapshot(
        observed_at=status.observed_at, certain=status.certain, head=head, successor=successor,
        allocations=workers, submissions=submissions, error=status.error,
        document_version=doc.version,
        head_job_id=doc.allocation.job_id if doc.allocation is not None else None,
        closed=doc.closed, queue_tokens=tokens)


def _unsettled(sub: Submission, doc: SessionDocument) -> bool:
    if sub.status in _OPEN or sub.status == "failed":
        return True
    return sub.status == "submitted" and bool(sub.job_id) and sub.job_id not in doc.workers


def _ray_head_job(text: str | None) -> str | None:
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "job_id" and value.strip():
            return value.strip()
    return None


def _scheduler_facts(job_id: str, status: StatusSnapshot) -> dict[str, object]:
    """state, reason, time left/limit, tres, granted GPUs and nodes of ``job_id``."""
    unknown: dict[str, object] = {"state": None, "reason": None, "time_left_seconds": None,
                                  "time_limit_seconds": None, "tres": None,
                                  "granted_gpus": None, "nodes": None, "count": None}
    if not status.certain:
        return unknown
    observed = status.job(job_id)
    record = status.queue.get(job_id)
    if observed.state is None:
        return {**unknown, "state": ENDED if job_id in status.absent else None}
    state = observed.state
    running = state is JobState.RUNNING
    facts = dict(unknown, state=state.value, reason=observed.reason)
    if record is not None:
        facts.update(
            time_left_seconds=record.time_left_seconds if running else None,
            time_limit_seconds=record.time_limit_seconds, tres=record.tres_alloc,
            granted_gpus=granted_gpus(record.tres_alloc) if running else None,
            nodes=tuple(record.nodes) if record.nodes is not None else None,
            count=record.num_nodes)
    return facts


def granted_gpus(tres: str | None) -> int | None:
    """GPUs in a TRES string (``gres/gpu=2``; typed entries ``gres/gpu:a100=2`` are summed
    when the total is missing); 0 when it names none; None for no string."""
    if tres is None:
        return None
    total = _GPU_TOTAL.search(tres)
    if total is not None:
        return int(total.group(1))
    return sum(int(n) for n in _GPU_TRES.findall(tres))


def _committed(state: str | None, released: bool) -> bool | None:
    if released:
        return False
    if state is None:
        return None
    if state == ENDED:
        return False
    parsed = JobState.parse(state)
    return bool(parsed.active) if parsed is not JobState.UNKNOWN else None


def _int(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _head(record: Allocation, role: str, status: StatusSnapshot) -> AllocationSnapshot:
    job_id = record.job_id or ""
    facts = _scheduler_facts(job_id, status)
    state = facts["state"] if job_id else None
    nodes = facts["nodes"] if facts["nodes"] is not None else (
        tuple(record.nodes) if record.nodes else None)
    config = record.config or {}
    ready = None if state is None else (state == "RUNNING" and record.ready_at is not None)
    return AllocationSnapshot(
        slurm_job_id=job_id, role=role, state=state, reason=facts["reason"],  # type: ignore[arg-type]
        time_left_seconds=facts["time_left_seconds"],  # type: ignore[arg-type]
        time_limit_seconds=facts["time_limit_seconds"],  # type: ignore[arg-type]
        requested_nodes=_int(config.get("num_nodes")) or _int(facts["count"]),
        requested_gpus_per_node=_int(config.get("gpus_per_node")),
        tres=facts["tres"], granted_gpus=facts["granted_gpus"],  # type: ignore[arg-type]
        nodes=nodes, ray_nodes=None, ready=ready,  # type: ignore[arg-type]
        draining=record.drain_requested_at is not None, intent=None, drain_deadline=None,
        submitted_at=None, committed=_committed(state, False))  # type: ignore[arg-type]


def _worker(record: Worker, status: StatusSnapshot, files: Mapping[str, str | None],
            paths: SessionPaths, head_job: str | None, hosts_head: bool) -> AllocationSnapshot:
    job_id = record.job_id
    facts = _scheduler_facts(job_id, status)
    state = facts["state"]
    listed = facts["nodes"]
    written = [line.strip() for line in (files.get(paths.nodes(job_id)) or "").splitlines()
               if line.strip()]
    if listed:
        nodes: tuple[str, ...] | None = listed  # type: ignore[assignment]
    elif written:
        nodes = tuple(written)
    elif state is not None:
        nodes = ()
    else:
        nodes = tuple(record.nodes) if record.nodes else None
    joined = {}
    for line in (files.get(paths.ray_nodes(job_id)) or "").splitlines():
        fields = line.split()
        if len(fields) == 3 and (head_job is None or fields[2] == head_job):
            joined[fields[0]] = fields[1]
    word = (files.get(paths.worker_state(job_id)) or "").strip() or None
    if nodes is None:
        ready: bool | None = None
    else:
        ready = bool(nodes) and all(host in joined for host in nodes) and state == "RUNNING"
        if state is None and nodes and all(host in joined for host in nodes):
            ready = None  # joined once, but whether it still runs is not known
    config = record.config or {}
    return AllocationSnapshot(
        slurm_job_id=job_id, role="worker", state=state,  # type: ignore[arg-type]
        reason=facts["reason"],  # type: ignore[arg-type]
        time_left_seconds=facts["time_left_seconds"],  # type: ignore[arg-type]
        time_limit_seconds=facts["time_limit_seconds"],  # type: ignore[arg-type]
        requested_nodes=_int(config.get("num_nodes")) or _int(facts["count"]),
        requested_gpus_per_node=_int(config.get("gpus_per_node")),
        tres=facts["tres"], granted_gpus=facts["granted_gpus"],  # type: ignore[arg-type]
        nodes=nodes, ray_nodes={h: joined[h] for h in sorted(joined)}, ready=ready,
        draining=record.drain_deadline is not None or word == WORKER_DRAINING,
        intent=record.intent, drain_deadline=record.drain_deadline,
        submitted_at=record.submitted_at if record.reconciled else None,
        committed=_committed(state, record.released),  # type: ignore[arg-type]
        released=record.released, worker_state=word, hosts_head=hosts_head)
