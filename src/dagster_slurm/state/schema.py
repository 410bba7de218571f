"""The session document (``allocation.json``): typed models of schema version 1.

One JSON document per run session records everything a restarted process needs to find the
session's Slurm jobs again. It is changed only through patches applied by a
:class:`~dagster_slurm.state.store.StateStore` (under the session lock), and read here as
frozen pydantic models.

Layout (``SCHEMA_VERSION = 1``; every time is epoch seconds from the login node's clock)::

    {
      "schema_version": 1,
      "version": 12,                 # owned by the store: +1 on every write
      "job_name": "dgs-...",         # the Slurm job name shared by all of the session's jobs
      "run_id": "...",               # Dagster run id (None for sessions not tied to a run)
      "created_at": 1700000000.0,
      "allocation": Allocation | null,   # the current head allocation
      "successor": Allocation | null,    # a queued or running successor, before promotion
      "workers": {job_id: Worker},       # worker allocations joined to the head's Ray cluster
      "worker_submissions": {token: Submission},  # submissions, recorded before sbatch runs
      "election": Election | null,       # a head election in progress (and past failures)
      "heartbeat": Heartbeat | null,     # the supervising process's last sign of life
      "leases": {name: Lease},           # named leases with lifetimes (see lease.py)
      "tags": {key: value},              # Dagster run tags the session published
      "history": {name: Allocation},     # ended allocations, by job id (or token), with
                                         # final_state and ended_at; never removed
      "closed_at": float | null,         # set by teardown/orphan reconciliation: no process
      "closed_reason": str | null        # submits for a closed session again
    }

Allocation: ``kind`` (``head``), ``job_id`` (None until sbatch answered), ``token`` (recorded
before sbatch ran; the job's ``--comment``), ``status`` (``submitting`` -> ``submitted`` with a
job id, or ``failed``/``unknown`` when sbatch refused or did not answer), ``submitted_at``,
``finished_at`` (when sbatch answered), ``rc`` and ``error`` (sbatch's exit code and message),
``config`` (a snapshot of the allocation config), ``nodes`` and ``ray_address`` (written once
the step server is ready, with ``ready_at``), ``drain_requested_at``; in ``history`` also
``final_state`` (the scheduler state it ended in, or why it was retired: ``REPLACED`` for a
head a promoted successor replaced) and ``ended_at``. A successor record also has
``predecessor`` (the head's job id when it was queued); a promoted one, as head,
``promoted_from`` (the job id it replaced, None when the predecessor had ended before).
Worker: ``job_id``, ``role`` (``worker``), ``intent`` (key of the intent that owns it, or
None), ``token``, ``submitted_at`` (None unless submitted by intent reconciliation),
``drain_deadline`` (persisted before a drain starts), ``released``, ``config``, ``nodes``,
``ray_node_ids`` (Slurm node name -> Ray node id), ``final_state`` (the scheduler state it
ended in, when known at its release), ``released_at`` and ``reconciled`` (True when
``reconcile_workers`` submitted it: then ``submitted_at`` counts for ``pending_timeout``).
Submission (in flight): ``token``, ``status`` (``submitting`` ->
``submitted``/``failed``/``unknown``), ``submitted_at`` (when it started), ``finished_at``,
``job_id``, ``rc``, ``error``, ``kind``, ``intent``, ``shape`` (the sbatch options it was
submitted with), ``config``.
Election: ``term``, ``candidate`` (job id), ``claimed_by`` (lease owner), ``started_at``,
``expires_at``, ``failures`` (job id -> failed head starts).
Heartbeat: ``host``, ``pid``, ``at``. Lease: ``owner``, ``acquired_at``, ``renewed_at``,
``expires_at``, ``ttl``.

Compatibility: unknown keys, at any level, are kept when a document is read and written back
(models allow extra fields), so an older library preserves what a newer one added. A change
that older code would misread raises ``SCHEMA_VERSION``; stores refuse to modify a document
whose ``schema_version`` is newer than theirs. Status strings are open sets: code must treat
an unknown status as "not understood", never as a known one.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Allocation(_Record):
    """A head allocation (the current one, a successor, or an ended one in ``history``)."""

    kind: str | None = None
    job_id: str | None = None
    token: str | None = None
    status: str = "submitting"
    submitted_at: float | None = None
    finished_at: float | None = None
    rc: int | None = None
    error: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    nodes: list[str] = Field(default_factory=list)
    ray_address: str | None = None
    ready_at: float | None = None
    drain_requested_at: float | None = None
    final_state: str | None = None
    ended_at: float | None = None
    predecessor: str | None = None
    promoted_from: str | None = None


class Worker(_Record):
    """A worker allocation whose nodes join the head's Ray cluster."""

    job_id: str
    role: str = "worker"
    intent: str | None = None
    token: str | None = None
    submitted_at: float | None = None
    drain_deadline: float | None = None
    released: bool = False
    config: dict[str, Any] = Field(default_factory=dict)
    nodes: list[str] = Field(default_factory=list)
    ray_node_ids: dict[str, str] = Field(default_factory=dict)
    final_state: str | None = None
    released_at: float | None = None
    reconciled: bool = False


class Submission(_Record):
    """A submission recorded under its token before sbatch ran."""

    token: str
    status: str
    submitted_at: float | None = None
    finished_at: float | None = None
    job_id: str | None = None
    rc: int | None = None
    error: str | None = None
    kind: str | None = None
    intent: str | None = None
    shape: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)


class Election(_Record):
    """A head election: who runs it, for which candidate, until when its claim holds."""

    term: int = 0
    candidate: str | None = None
    claimed_by: str | None = None
    started_at: float | None = None
    expires_at: float | None = None
    failures: dict[str, int] = Field(default_factory=dict)


class Heartbeat(_Record):
    """The supervising process's last sign of life."""

    host: str
    pid: int
    at: float


class Lease(_Record):
    """A named lease: held by ``owner`` until ``expires_at`` (login node clock)."""

    owner: str
    acquired_at: float
    renewed_at: float
    expires_at: float
    ttl: float

    def expired(self, now: float) -> bool:
        """True once ``now`` reaches ``expires_at`` (the boundary counts as expired)."""
        return now >= self.expires_at


class SessionDocument(_Record):
    """The whole session document; see the module docstring."""

    schema_version: int = SCHEMA_VERSION
    version: int = 0
    job_name: str
    run_id: str | None = None
    created_at: float | None = None
    allocation: Allocation | None = None
    successor: Allocation | None = None
    workers: dict[str, Worker] = Field(default_factory=dict)
    worker_submissions: dict[str, Submission] = Field(default_factory=dict)
    election: Election | None = None
    heartbeat: Heartbeat | None = None
    leases: dict[str, Lease] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    history: dict[str, Allocation] = Field(default_factory=dict)
    closed_at: float | None = None
    closed_reason: str | None = None

    @property
    def closed(self) -> bool:
        """True once teardown or orphan reconciliation closed the session."""
        return self.closed_at is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionDocument:
        """Validate a raw document (unknown keys are kept)."""
        return cls.model_validate(data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, including unknown keys read earlier."""
        return self.model_dump(mode="json")


def new_session_document(
    job_name: str,
    run_id: str | None = None,
    created_at: float | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The initial document of a session, ready to pass as a store's ``initial`` document."""
    return SessionDocument(
        job_name=job_name, run_id=run_id, created_at=created_at, tags=dict(tags or {})
    ).to_dict()
