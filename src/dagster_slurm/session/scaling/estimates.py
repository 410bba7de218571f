"""Start estimates for candidate worker allocations: ``session.estimate_worker_starts``.

A candidate is a :class:`~dagster_slurm.session.core.worker_config.SlurmWorkerAllocationConfig`
that the application considers adding. :func:`worker_requests` renders each one as
:meth:`RunSession.add_worker_allocation` would submit it: resolved with
:func:`~dagster_slurm.session.core.worker_config.resolve_worker_config` against the session's
first worker allocation or, without one, the head allocation's request, then turned into
its sbatch request by :func:`~dagster_slurm.session.workers.job_script.worker_submission` (so
inherited account, QoS, reservation, memory and walltime apply).
:func:`worker_sbatch_options` returns those options: the sbatch argv without ``sbatch``
itself, the batch script's path and the per-submission ``--comment`` token.

:class:`SbatchTestOnlyEstimator`, the default estimator, asks ``sbatch --test-only`` about
every candidate in one agent batch, that is one SSH round trip, together with the read of
the session document that tells which allocation the candidates inherit from. It renders
with the first worker allocation it saw last (none at first) and checks that against the
document of the same round trip; only when a first worker allocation appeared meanwhile
does it render again and ask once more (a first worker allocation never changes once
there is one). Each candidate costs one scheduler RPC (``sbatch_test`` in the scheduler's
stats); answers are reused for ``cache_seconds`` per rendered option list, and a call whose
candidates all have fresh answers and whose first worker allocation is known sends nothing.

Guarantees and non-guarantees:

* Nothing is queued; each estimate consumes a job id. Estimates are advisory and reserve
  nothing: other jobs can take the resources before a submission arrives.
* ``start_in_seconds`` counts from the login node's clock at the answer (a reused answer:
  that clock plus the local time elapsed since), 0.0 for a start that is due.
* More than ``max_candidates`` candidates raise
  :class:`~dagster_slurm.errors.ConfigurationError` before anything is sent.
* A candidate the scheduler rejects has ``error`` set and ``start_in_seconds`` None; so has
  one that got no verdict (sbatch timed out, or printed no estimate); such an answer is not
  reused. A transport failure raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.scheduler.client import new_token
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.worker_config import (
    SlurmWorkerAllocationConfig,
    resolve_worker_config,
)
from dagster_slurm.session.workers.job_script import worker_submission
from dagster_slurm.session.workers.submit import first_worker
from dagster_slurm.slurm.commands import SbatchSpec, sbatch_argv
from dagster_slurm.slurm.test_only import TestOnlyResult, seconds_until_start
from dagster_slurm.slurm.walltime import parse_duration
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import SessionDocument

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext

#: Candidates one call of the default estimator accepts.
DEFAULT_MAX_CANDIDATES = 8

#: Seconds the default estimator reuses an answer.
DEFAULT_CACHE_SECONDS = 60.0

#: Sessions whose first worker allocation an estimator remembers (the oldest are dropped).
_REMEMBERED_SESSIONS = 256


@dataclass(frozen=True)
class WorkerStartEstimate:
    """The scheduler's start estimate for one candidate worker allocation."""

    config: SlurmWorkerAllocationConfig
    """The candidate, as passed in (not resolved)."""
    start_in_seconds: float | None
    """Seconds from the login node's clock to the estimated start; 0.0 when it would start
    now. None when there is no estimate (see ``error``)."""
    time_limit_seconds: float | None
    """The walltime the candidate would request, inherited or its own, in seconds
    (``math.inf`` for ``UNLIMITED``); None when it cannot be read."""
    error: str | None
    """The scheduler's message for a rejected candidate (e.g. ``Invalid partition name
    specified``), or why there is no estimate; None when there is one."""
    partition: str | None = None
    """The partition it would start in (the first that fits of a comma list); None
    without an estimate."""
    nodes: tuple[str, ...] | None = None
    """The nodes it would start on; None without an estimate."""
    options: tuple[str, ...] = ()
    """The sbatch options asked about (see :func:`worker_sbatch_options`)."""

    def starts_within(self, seconds: float) -> bool:
        """True when the estimate says the candidate starts within ``seconds``; False
        without an estimate."""
        return self.start_in_seconds is not None and self.start_in_seconds <= seconds


@runtime_checkable
class WorkerStartEstimator(Protocol):
    """What ``session.estimate_worker_starts(candidates, estimator=...)`` accepts: any
    object with this method (a reservation calendar, a site's own forecast)."""

    def estimate(self, session: SessionContext,
                 candidates: Sequence[SlurmWorkerAllocationConfig]) -> Sequence[WorkerStartEstimate]:
        """One estimate per candidate, in the candidates' order."""
        ...


@dataclass(frozen=True)
class WorkerRequest:
    """A candidate rendered as add_worker_allocation would submit it: the candidate, the
    resolved configuration, its sbatch request and the options of that request."""

    config: SlurmWorkerAllocationConfig
    resolved: SlurmWorkerAllocationConfig
    spec: SbatchSpec
    options: tuple[str, ...]


# -- rendering ------------------------------------------------------------------------------------
def check_candidates(candidates: Any, limit: int | None = None) -> list[SlurmWorkerAllocationConfig]:
    """``candidates`` as a list, each a SlurmWorkerAllocationConfig and, with ``limit``, at
    most that many; else :class:`ConfigurationError` naming ``candidates``."""
    if isinstance(candidates, (SlurmWorkerAllocationConfig, str, bytes)) or not isinstance(
            candidates, Sequence):
        raise ConfigurationError("candidates", candidates,
                                 "must be a list of SlurmWorkerAllocationConfig")
    listed = list(candidates)
    for index, candidate in enumerate(listed):
        if not isinstance(candidate, SlurmWorkerAllocationConfig):
            raise ConfigurationError(f"candidates[{index}]", candidate,
                                     "must be a SlurmWorkerAllocationConfig")
    if limit is not None and len(listed) > limit:
        raise ConfigurationError(
            "candidates", f"{len(listed)} candidates",
            f"at most {limit} per call (the estimator's max_candidates): each costs one "
            "scheduler RPC; pass fewer, or an estimator with a higher max_candidates")
    return listed


def check_open(session: SessionContext, doc: SessionDocument | None) -> None:
    """Raise :class:`SessionError` when the session is closed (in this process, or in
    ``doc``) or its launcher is not a RayLauncher: add_worker_allocation would refuse."""
    from dagster_slurm.launchers.ray import RayLauncher

    if session.current.closed:
        raise SessionError(f"the run session {session.job_name} was closed in this process")
    if not isinstance(session.launcher, RayLauncher):
        raise SessionError(
            f"the run session {session.job_name} uses {type(session.launcher).__name__}; "
            "worker allocations join a Ray cluster, so the session's launcher must be a "
            "RayLauncher (default_launcher=RayLauncher(...)) before their starts are estimated")
    if doc is not None and doc.closed:
        raise SessionError(tr.closed_message(doc, session.job_name))


def worker_requests(session: SessionContext, candidates: Sequence[SlurmWorkerAllocationConfig],
                    first: SlurmWorkerAllocationConfig | None) -> list[WorkerRequest]:
    """Each candidate rendered with ``first`` (the session's first worker allocation, None
    without one) as its source, exactly as add_worker_allocation resolves and renders it.
    The batch script is rendered without the environment's activation (which does not
    change the options), so nothing is deployed."""
    from dagster_slurm.launchers.ray import RayLauncher

    launcher = session.launcher
    assert isinstance(launcher, RayLauncher)  # check_open first
    requests = []
    for candidate in candidates:
        resolved = resolve_worker_config(candidate, first, session.queue)
        spec, _files = worker_submission(paths=session.paths, job_name=session.job_name,
                                         launcher=launcher, config=resolved, activation=None,
                                         token=new_token())
        options = tuple(sbatch_argv(spec, script_on_stdin=True)[1:])
        requests.append(WorkerRequest(candidate, resolved, spec, options))
    return requests


def worker_sbatch_options(session: SessionContext,
                          candidates: Sequence[SlurmWorkerAllocationConfig]) -> list[list[str]]:
    """For each candidate, the sbatch options add_worker_allocation would submit now (one
    read of the session document); see the module docstring."""
    listed = check_candidates(candidates)
    check_open(session, None)
    doc = session.io.read().doc
    check_open(session, doc)
    return [list(request.options) for request in worker_requests(session, listed, first_worker(doc))]


# -- the default estimator ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Answer:
    result: TestOnlyResult
    login_now: float  # the login node's clock at the answer
    local: float  # the estimator's clock at the answer


class SbatchTestOnlyEstimator:
    """Start estimates from ``sbatch --test-only``, all candidates in one SSH round trip;
    see the module docstring.

    ``max_candidates``: most candidates per call (each costs one scheduler RPC);
    ``cache_seconds``: how long an answer is reused for the same rendered options (0: never);
    ``clock``: monotonic seconds (injected by tests). Thread-safe; one estimator may serve
    several sessions (their options differ in the job name).
    """

    def __init__(self, max_candidates: int = DEFAULT_MAX_CANDIDATES,
                 cache_seconds: float = DEFAULT_CACHE_SECONDS, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(max_candidates, bool) or not isinstance(max_candidates, int) or max_candidates < 1:
            raise ConfigurationError("max_candidates", max_candidates, "must be a whole number >= 1")
        if isinstance(cache_seconds, bool) or not isinstance(cache_seconds, (int, float)) or not (
                0 <= cache_seconds < float("inf")):
            raise ConfigurationError("cache_seconds", cache_seconds,
                                     "must be a finite number of seconds >= 0")
        self.max_candidates = max_candidates
        self.cache_seconds = float(cache_seconds)
        self.clock = clock
        self._answers: dict[tuple[str, ...], _Answer] = {}
        self._first: dict[str, SlurmWorkerAllocationConfig] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"SbatchTestOnlyEstimator(max_candidates={self.max_candidates}, "
                f"cache_seconds={self.cache_seconds:g})")

    def estimate(self, session: SessionContext,
                 candidates: Sequence[SlurmWorkerAllocationConfig]) -> list[WorkerStartEstimate]:
        """One estimate per candidate, in order."""
        listed = check_candidates(candidates, self.max_candidates)
        if not listed:
            return []
        check_open(session, None)
        with self._lock:
            first = self._first.get(session.job_name)
        try:
            requests = worker_requests(session, listed, first)
        except ConfigurationError:
            if first is not None:
                raise
            # inherited from the head, a candidate does not hold; a first worker allocation
            # may have appeared meanwhile: render from the document before refusing
            doc = session.io.read().doc
            check_open(session, doc)
            first = first_worker(doc)
            if first is None:
                raise
            self._remember(session.job_name, first)
            requests = worker_requests(session, listed, first)
        found, missing = self._lookup(requests)
        if first is not None and not missing:
            return [self._estimate(request, found[request.options]) for request in requests]
        probe = session.io.probe_starts([r.spec for r in missing], with_document=True)
        found.update(self._keep(missing, probe.answers, probe.now))
        assert probe.document is not None
        doc = probe.document.doc
        check_open(session, doc)
        actual = first_worker(doc)
        if actual is not None and (first is None or actual.snapshot() != first.snapshot()):
            self._remember(session.job_name, actual)
            requests = worker_requests(session, listed, actual)  # a first worker appeared
            again, missing = self._lookup(requests)
            found.update(again)
            if missing:
                probe = session.io.probe_starts([r.spec for r in missing], with_document=False)
                found.update(self._keep(missing, probe.answers, probe.now))
        return [self._estimate(request, found[request.options]) for request in requests]

    def _lookup(self, requests: list[WorkerRequest]
                ) -> tuple[dict[tuple[str, ...], _Answer], list[WorkerRequest]]:
        """Fresh answers by options, and the requests (one per distinct options) without."""
        now = self.clock()
        found: dict[tuple[str, ...], _Answer] = {}
        missing: dict[tuple[str, ...], WorkerRequest] = {}
        with self._lock:
            for request in requests:
                answer = self._answers.get(request.options)
                if answer is not None and now - answer.local <= self.cache_seconds:
                    found[request.options] = answer
                else:
                    missing.setdefault(request.options, request)
        return found, list(missing.values())

    def _keep(self, requests: list[WorkerRequest], results: Sequence[TestOnlyResult],
              login_now: float) -> dict[tuple[str, ...], _Answer]:
        """The answers of one probe by options; verdicts are cached, expired entries dropped."""
        local = self.clock()
        fresh = {request.options: _Answer(result, login_now, local)
                 for request, result in zip(requests, results, strict=True)}
        with self._lock:
            self._answers = {key: answer for key, answer in self._answers.items()
                             if local - answer.local <= self.cache_seconds}
            if self.cache_seconds > 0:
                self._answers.update({key: answer for key, answer in fresh.items()
                                      if answer.result.runnable is not None})
        return fresh

    def _remember(self, job_name: str, first: SlurmWorkerAllocationConfig) -> None:
        with self._lock:
            self._first.pop(job_name, None)
            self._first[job_name] = first
            while len(self._first) > _REMEMBERED_SESSIONS:
                self._first.pop(next(iter(self._first)))

    def _estimate(self, request: WorkerRequest, answer: _Answer) -> WorkerStartEstimate:
        result = answer.result
        start_in = seconds_until_start(result, answer.login_now + (self.clock() - answer.local))
        error = None
        if start_in is None:
            error = result.error or "sbatch --test-only printed no start estimate"
        return WorkerStartEstimate(
            config=request.config,
            start_in_seconds=start_in,
            time_limit_seconds=parse_duration(request.resolved.time_limit),
            error=error,
            partition=result.partition if start_in is not None else None,
            nodes=result.nodes if start_in is not None else None,
            options=request.options,
        )


_default: SbatchTestOnlyEstimator | None = None
_default_lock = threading.Lock()


def default_estimator() -> SbatchTestOnlyEstimator:
    """The estimator ``estimate_worker_starts`` uses without one: a
    :class:`SbatchTestOnlyEstimator` with the default limits, shared by the sessions of
    this process (so answers are reused across calls)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SbatchTestOnlyEstimator()
        return _default


def estimate_worker_starts(session: SessionContext, candidates: Sequence[SlurmWorkerAllocationConfig],
                           estimator: WorkerStartEstimator | None = None) -> list[WorkerStartEstimate]:
    """``estimator.estimate(session, candidates)`` (None: :func:`default_estimator`), as a list."""
    chosen = default_estimator() if estimator is None else estimator
    if not callable(getattr(chosen, "estimate", None)):
        raise ConfigurationError(
            "estimator", chosen,
            "must have an estimate(session, candidates) method, like SbatchTestOnlyEstimator")
    return list(chosen.estimate(session, candidates))
