"""What a run session asks of the cluster: one small interface, each call one round trip.

:class:`RunSession` decides; :class:`SessionIO` carries its decisions out. The cluster
implementation, :class:`AgentSessionIO`, sends each call as one agent request (batching the
operations a call needs, e.g. squeue and the step server's ready file together). Unit tests
give the session an in-memory implementation (a :class:`~dagster_slurm.state.store.MemoryStateStore`,
a scripted queue and a fake clock) and so test every decision without a cluster or a real
sleep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dagster_slurm.agent import exec_op, read_op, tail_op, write_file_op
from dagster_slurm.agent.results import TailRequest, TxnResult
from dagster_slurm.errors import SchedulerError
from dagster_slurm.scheduler.client import SlurmScheduler, StatusSnapshot, SubmittedJob
from dagster_slurm.scheduler.submit_wait import LimitWait
from dagster_slurm.session.core.batch_io import (
    Observation,
    Step,
    StepOutcome,
    agent_act,
    agent_observe,
    job_gone,
)
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.slurm.accounting import SacctRecord
from dagster_slurm.slurm.commands import SbatchSpec, scancel_argv
from dagster_slurm.slurm.test_only import TestOnlyResult
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.schema import SessionDocument
from dagster_slurm.state.store import AgentStateStore, StateStore
from dagster_slurm.state.transitions import Change, document

Files = Mapping[str, tuple[str | bytes, int]]

#: Lists the unfinished steps of an allocation (argument: its requests directory): a request
#: not claimed yet, or a claimed one whose status file (the fourth line) does not exist yet.
_ACTIVE_STEPS = r"""
cd -- "$1" 2>/dev/null || exit 0
for f in *.request; do
    [ -e "$f" ] && printf 'waiting %s\n' "${f%.request}"
done
for f in *.taken; do
    [ -e "$f" ] || continue
    { IFS= read -r _ && IFS= read -r _ && IFS= read -r _ && IFS= read -r status \
        && IFS= read -r _ && IFS= read -r name; } < "$f" || continue
    # a status file, or no invocation directory any more (cleaned up): finished
    [ -e "$status" ] || [ ! -d "${status%/*}" ] || printf 'running %s\n' "$name"
done
exit 0
"""


@dataclass(frozen=True)
class DocumentRead:
    """The session document (None before it exists) and the login node's clock at the read."""

    doc: SessionDocument | None
    now: float


@dataclass(frozen=True)
class ReadyPoll:
    """One look at an allocation being waited for: the step server's ready file (its text
    once complete, else None) and, when asked for, the scheduler's answer."""

    ready: str | None
    status: StatusSnapshot | None


@dataclass(frozen=True)
class FilesPoll:
    """One look at a few small files of an allocation (path -> text, None when missing)
    and, when asked for, the scheduler's answer."""

    texts: Mapping[str, str | None]
    status: StatusSnapshot | None


@dataclass(frozen=True)
class StartProbe:
    """One round trip of start estimates: ``sbatch --test-only``'s answer for each
    request, in order (``start_time`` in UTC, see
    :func:`~dagster_slurm.slurm.test_only.start_epoch`), the session document when it was
    asked for (None otherwise) and the login node's clock after the last answer."""

    answers: tuple[TestOnlyResult, ...]
    document: DocumentRead | None
    now: float


class SessionIO(Protocol):
    """The cluster as a run session sees it (see the module docstring)."""

    store: StateStore

    def read(self) -> DocumentRead:
        """The session document, unlocked."""

    def apply(self, change: Change) -> TxnResult:
        """Apply a transition's patch under the session lock (``ok`` False: a guard failed)."""

    def submit(self, spec: SbatchSpec, *, files: Files, token: str,
               record_value: Mapping[str, Any], create: Mapping[str, Any],
               record: str = "/allocation",
               guards: Sequence[Mapping[str, Any]] = tr.SUBMIT_GUARDS,
               on_submitted: tuple[str, Mapping[str, Any]] | None = None,
               limit_wait: LimitWait | None = None) -> SubmittedJob:
        """Write ``files``, record ``token`` at ``record`` (``/allocation``, ``/successor``
        or ``/worker_submissions/<token>``) if absent and ``guards`` hold (the head's: the
        session is open, :data:`~dagster_slurm.state.transitions.SUBMIT_GUARDS`), run
        sbatch; with ``on_submitted`` (``("/workers/{job_id}", value)``) the job's own record
        is written with its id; ``limit_wait``: how to wait under a submission limit (None: a
        refusal for one raises SubmitLimitReached). Raises SubmissionInDoubt when another
        record is there, SubmitGuardFailed when a guard failed."""

    def write_files(self, files: Files) -> None:
        """Write ``files`` in their order (one round trip; parents are created)."""

    def poll_files(self, job_name: str, job_id: str, paths: Sequence[str], *,
                   with_status: bool) -> FilesPoll:
        """The small files ``paths`` and, with ``with_status``, squeue for ``job_name``
        and ``job_id`` (one round trip)."""

    def active_steps(self, job_id: str) -> list[str]:
        """The steps of allocation ``job_id`` that have not finished: requested and not yet
        claimed by its step server (``waiting <request id>``), or started without a status
        file yet (``running <step name>``)."""

    def queue(self, job_names: Sequence[str], known_ids: Sequence[str] = ()) -> StatusSnapshot:
        """squeue for the session's job name(s); ``known_ids`` that squeue no longer lists
        are reported absent (a certain answer: they ended), with sacct's record if any."""

    def poll_ready(self, job_name: str, job_id: str, *, with_status: bool) -> ReadyPoll:
        """The ready file of ``job_id`` and, with ``with_status``, squeue (one round trip)."""

    def beat(self, change: Change, content: str) -> None:
        """Apply the heartbeat ``change`` and write the heartbeat file (one round trip)."""

    def cancel(self, job_ids: Sequence[str] = (), *, job_name: str | None = None) -> None:
        """scancel the jobs (by id, or every job of ``job_name``)."""

    def signal_batch(self, job_id: str, signal: str, files: Files | None = None) -> bool:
        """Write ``files``, then ``scancel --batch --signal=<signal> <job id>`` (one round
        trip; the signal is sent only once the files are written). False when scancel says
        the job is no longer there (it ended); raises SchedulerError when it failed."""

    def signal_steps(self, job_id: str, signal: str) -> bool:
        """``scancel --signal=<signal> <job id>``: every process of the job's steps (not its
        batch shell). False when scancel says the job is no longer there (it ended); raises
        SchedulerError when it failed."""

    def accounting(self, job_ids: Sequence[str]) -> Mapping[str, SacctRecord]:
        """sacct for the jobs, by job id (empty when sacct failed or knows none of them)."""

    def probe_starts(self, specs: Sequence[SbatchSpec], *, with_document: bool) -> StartProbe:
        """``sbatch --test-only`` for each of ``specs`` (nothing is queued) and, with
        ``with_document``, the session document read first (one round trip)."""

    def tail(self, path: str, lines: int) -> str:
        """The last ``lines`` lines of a file on the cluster (``""`` when missing)."""

    def read_lines(self, path: str) -> list[str]:
        """The non-blank lines of a small file on the cluster."""

    def observe(self, lease_patch: Sequence[Mapping[str, Any]] | None) -> Observation:
        """Optionally apply ``lease_patch`` under the lock, then read the document, squeue
        for the session's job name (sacct for known jobs it no longer lists) and the small
        files of every known job (one round trip; see
        :mod:`dagster_slurm.session.core.batch_io`)."""

    def act(self, steps: Sequence[Step]) -> list[StepOutcome]:
        """Run ``steps`` in their order (one round trip); one outcome per step."""

    @property
    def scheduler(self) -> SlurmScheduler | None:
        """The scheduler client the allocation's steps use (None in unit tests)."""


class AgentSessionIO:
    """:class:`SessionIO` over the cluster-side agent of ``slurm`` (a SlurmResource)."""

    def __init__(self, slurm: Any, paths: SessionPaths, initial: Mapping[str, Any]) -> None:
        self.slurm = slurm
        self.paths = paths
        self.initial = dict(initial)
        self._job_name = str(initial.get("job_name") or "")

    @property
    def store(self) -> StateStore:
        return AgentStateStore(self.slurm.agent(), self.paths.session_dir, initial=self.initial)

    @property
    def scheduler(self) -> SlurmScheduler:
        return self.slurm.scheduler()

    def read(self) -> DocumentRead:
        snap = self.store.snapshot()
        return DocumentRead(document(snap.doc, self._job_name), snap.now)

    def apply(self, change: Change) -> TxnResult:
        return self.store.transact(change.patch)

    def submit(self, spec: SbatchSpec, *, files: Files, token: str,
               record_value: Mapping[str, Any], create: Mapping[str, Any],
               record: str = "/allocation",
               guards: Sequence[Mapping[str, Any]] = tr.SUBMIT_GUARDS,
               on_submitted: tuple[str, Mapping[str, Any]] | None = None,
               limit_wait: LimitWait | None = None) -> SubmittedJob:
        return self.scheduler.submit(
            spec, state_path=self.paths.document, lock_path=self.paths.lock,
            record=record, record_value=record_value, create=create, files=files,
            token=token, guards=guards, on_submitted=on_submitted, limit_wait=limit_wait,
        )

    def write_files(self, files: Files) -> None:
        with self.slurm.agent().batch() as batch:
            written = [batch.add(write_file_op(path, content, mode=mode, makedirs=True))
                       for path, (content, mode) in files.items()]
        for item in written:
            item.result()

    def active_steps(self, job_id: str) -> list[str]:
        requests = f"{self.paths.job_dir(job_id)}/requests"
        result = self.slurm.agent().run(exec_op(["bash", "-c", _ACTIVE_STEPS, "active", requests],
                                                timeout=30))
        if result.rc != 0:
            raise SchedulerError(f"could not list the steps of allocation {job_id}: "
                                 f"{result.stderr.strip() or f'exit code {result.rc}'}")
        return [line for line in result.stdout.splitlines() if line.strip()]

    def queue(self, job_names: Sequence[str], known_ids: Sequence[str] = ()) -> StatusSnapshot:
        return self.scheduler.status(list(job_names), list(known_ids))

    def poll_ready(self, job_name: str, job_id: str, *, with_status: bool) -> ReadyPoll:
        scheduler = self.scheduler
        with scheduler.agent.batch() as batch:
            status = batch.add(scheduler.status_op([job_name], [job_id], shared=True)) if with_status else None
            ready = batch.add(tail_op([TailRequest(self.paths.ready(job_id), 0, 65536)]))
        chunk = ready.result().files[0]
        complete = chunk.exists and chunk.eof and chunk.data.endswith(b"\n")
        text = chunk.data.decode("utf-8", "replace") if complete else None
        snapshot = None
        if status is not None:
            now = batch.response.now if batch.response else None
            snapshot = scheduler.snapshot(status.result(), now)
        return ReadyPoll(text, snapshot)

    def poll_files(self, job_name: str, job_id: str, paths: Sequence[str], *,
                   with_status: bool) -> FilesPoll:
        scheduler = self.scheduler
        with scheduler.agent.batch() as batch:
            status = batch.add(scheduler.status_op([job_name], [job_id], shared=True)) if with_status else None
            read = batch.add(tail_op([TailRequest(path, 0, 65536) for path in paths]))
        texts = {path: (chunk.data.decode("utf-8", "replace") if chunk.exists else None)
                 for path, chunk in zip(paths, read.result().files, strict=True)}
        snapshot = None
        if status is not None:
            now = batch.response.now if batch.response else None
            snapshot = scheduler.snapshot(status.result(), now)
        return FilesPoll(texts, snapshot)

    def beat(self, change: Change, content: str) -> None:
        store = self.store
        assert isinstance(store, AgentStateStore)
        with self.slurm.agent().batch() as batch:
            batch.add(store.txn_op(change.patch))
            batch.add(write_file_op(self.paths.heartbeat, content, makedirs=True))

    def cancel(self, job_ids: Sequence[str] = (), *, job_name: str | None = None) -> None:
        if job_name is not None:
            self.scheduler.cancel(job_name=job_name)
        else:
            self.scheduler.cancel(list(job_ids))

    def signal_batch(self, job_id: str, signal: str, files: Files | None = None) -> bool:
        scheduler = self.scheduler
        with scheduler.agent.batch() as batch:
            written = [batch.add(write_file_op(path, content, mode=mode, makedirs=True))
                       for path, (content, mode) in (files or {}).items()]
            signalled = batch.add(exec_op(scancel_argv([job_id], signal=signal,
                                                       batch_only=True), timeout=60),
                                  requires=written)
        for item in written:
            item.result()
        return self._signalled(signalled.result(), f"scancel --batch --signal={signal} {job_id}")

    def signal_steps(self, job_id: str, signal: str) -> bool:
        result = self.scheduler.agent.run(exec_op(scancel_argv([job_id], signal=signal), timeout=60))
        return self._signalled(result, f"scancel --signal={signal} {job_id}")

    def _signalled(self, result: Any, command: str) -> bool:
        self.scheduler.stats.count("scancel")
        if result.rc == 0:
            return True
        message = (result.stderr or result.stdout).strip()
        if job_gone(message):
            return False
        raise SchedulerError(f"{command} failed: {message or f'exit code {result.rc}'}")

    def accounting(self, job_ids: Sequence[str]) -> Mapping[str, SacctRecord]:
        return self.scheduler.accounting(list(job_ids))

    def observe(self, lease_patch: Sequence[Mapping[str, Any]] | None) -> Observation:
        return agent_observe(self.slurm, self.paths, self._job_name, self.initial, lease_patch)

    def act(self, steps: Sequence[Step]) -> list[StepOutcome]:
        return agent_act(self.slurm, self.paths, self.initial, steps)

    def probe_starts(self, specs: Sequence[SbatchSpec], *, with_document: bool) -> StartProbe:
        scheduler = self.scheduler
        with scheduler.agent.batch() as batch:
            read = batch.add(read_op(self.paths.document)) if with_document else None
            probes = [batch.add(scheduler.test_only_op(spec)) for spec in specs]
        now = batch.response.now if batch.response is not None else 0.0
        answers = tuple(scheduler.test_only_answer(probe) for probe in probes)
        document_read = None
        if read is not None:
            document_read = DocumentRead(document(read.result().doc, self._job_name), now)
        return StartProbe(answers, document_read, now)

    def tail(self, path: str, lines: int) -> str:
        from dagster_slurm.session.core.allocation import last_lines

        (text,) = last_lines(self.slurm.agent(), [path], lines)
        return text

    def read_lines(self, path: str) -> list[str]:
        chunk = self.slurm.agent().run(tail_op([TailRequest(path, 0, 65536)])).files[0]
        return [line for line in chunk.data.decode("utf-8", "replace").splitlines() if line.strip()]
