"""An in-memory cluster for unit tests of the run-session protocol.

:class:`FakeCluster` implements :class:`~dagster_slurm.session.core.io.SessionIO` with a
:class:`~dagster_slurm.state.store.MemoryStateStore` (the same patch code as the agent), a
scripted queue and a fake clock whose ``sleep`` only advances time. Its ``submit`` records the
head's submission the way the agent's submit operation does (the patch of
``transitions.submit_head``, then ``head_submitted``), so the session's decisions can be
tested without a cluster and without waiting. ``signal_batch`` records each signal with
the session document as it was then, and ``accounting`` answers the jobs' states as sacct
would (or nothing, with ``accounting_answers`` False).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster_slurm.agent.exceptions import SubmissionInDoubt, SubmitGuardFailed
from dagster_slurm.agent.results import TxnResult
from dagster_slurm.errors import SchedulerError, TransportError
from dagster_slurm.scheduler.client import StatusSnapshot, SubmittedJob
from dagster_slurm.session.core.batch_io import (
    Cancel,
    Observation,
    Signal,
    Step,
    StepOutcome,
    Txn,
    unobserved,
)
from dagster_slurm.session.core.io import DocumentRead, FilesPoll, ReadyPoll
from dagster_slurm.slurm.accounting import SacctRecord
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.parsers import SqueueRecord
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import successor_transitions as st_succ
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt
from dagster_slurm.state.store import MemoryStateStore

WALL_EPOCH = 1_800_000_000.0


class FakeClock:
    """Monotonic time ``t`` and the login node's wall clock ``WALL_EPOCH + t``; ``sleep``
    advances ``t`` and runs the hooks due by then (scripted cluster events)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept = 0.0
        self._hooks: list[tuple[float, Callable[[], None]]] = []

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> float:
        return WALL_EPOCH + self.t

    def at(self, when: float, hook: Callable[[], None]) -> None:
        """Run ``hook`` once the clock reaches ``when`` (during a sleep)."""
        self._hooks.append((when, hook))
        self._hooks.sort(key=lambda item: item[0])

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.t += seconds
        self.slept += seconds
        while self._hooks and self._hooks[0][0] <= self.t:
            _, hook = self._hooks.pop(0)
            hook()
        if self.slept > 100_000:
            raise AssertionError("the session waited forever (fake clock past 100000 s)")


@dataclass
class FakeJob:
    job_id: str
    name: str
    token: str
    state: JobState = JobState.PENDING
    reason: str | None = "Priority"
    nodes: tuple[str, ...] = ()
    ready: str | None = None
    time_left: float = 600.0
    tres: str | None = "cpu=2,mem=4000M,node=1,billing=2"


@dataclass
class FakeCluster:
    """See the module docstring. ``jobs`` by id; ``calls`` counts each kind of call."""

    initial: Mapping[str, Any]
    clock: FakeClock = field(default_factory=FakeClock)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    queue_answers: bool = True
    sbatch_error: str | None = None
    on_submit: Callable[[FakeJob], None] | None = None
    cancelled: list[str] = field(default_factory=list)
    beats: list[str] = field(default_factory=list)
    next_id: int = 100
    specs: list[SbatchSpec] = field(default_factory=list)
    steps: dict[str, list[str]] = field(default_factory=dict)
    """Per job id: the unfinished steps ``active_steps`` reports."""
    on_write: Callable[[Mapping[str, Any]], None] | None = None
    drained: dict[str, str] = field(default_factory=dict)
    """Per job id: the drain signal its step server recorded (``jobs/<id>/drained``)."""
    ray_stopped: dict[str, str] = field(default_factory=dict)
    """Per job id: when its step server saw its Ray head stop (``jobs/<id>/ray_stopped``)."""
    signals: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """``signal_batch`` calls: job id, signal, the session document when it was sent."""
    step_signals: list[tuple[str, str]] = field(default_factory=list)
    """``signal_steps`` calls that reached a job: job id, signal."""
    on_signal: Callable[[FakeJob, str], None] | None = None
    accounting_answers: bool = True
    """False: sacct knows nothing (it lags, or accounting is off)."""
    lose_submit_answer: bool = False
    """``act``: the next submission's job is queued but its job id is not recorded and the
    round trip fails (a connection cut right after sbatch)."""
    acts: list[list[Any]] = field(default_factory=list)
    """The steps of every ``act`` call."""

    def __post_init__(self) -> None:
        self.store = MemoryStateStore(self.initial, clock=self.clock.wall)

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    # -- SessionIO -------------------------------------------------------------------------
    @property
    def scheduler(self) -> None:
        return None

    def read(self) -> DocumentRead:
        self._count("read")
        snap = self.store.snapshot()
        return DocumentRead(tr.document(snap.doc, str(self.initial["job_name"])), snap.now)

    def apply(self, change: tr.Change) -> TxnResult:
        self._count(change.transition)
        return self.store.transact(change.patch)

    def submit(self, spec: SbatchSpec, *, files: Mapping[str, tuple[str | bytes, int]],
               token: str, record_value: Mapping[str, Any],
               create: Mapping[str, Any], record: str = "/allocation",
               guards: Sequence[Mapping[str, Any]] = tr.SUBMIT_GUARDS,
               on_submitted: tuple[str, Mapping[str, Any]] | None = None,
               limit_wait: Any = None) -> SubmittedJob:
        self._count("sbatch")
        worker = record.startswith(wt.SUBMISSIONS + "/")
        self.specs.append(spec)
        for path, (content, _mode) in files.items():
            self.files[path] = content if isinstance(content, str) else content.decode()
        # what the agent's submit op writes: the record if absent ...
        parents = [{"op": "setdefault", "path": wt.SUBMISSIONS, "value": {}}] if worker else []
        intent = self.store.transact([
            *guards,
            *parents,
            {"op": "absent", "path": record},
            {"op": "add", "path": record,
             "value": dict(record_value, token=token, status="submitting")},
            {"op": "add", "path": f"{record}/submitted_at", "value_now": 0},
        ])
        if not intent.ok and (intent.conflict or {}).get("index", 99) < len(guards) + len(parents):
            raise SubmitGuardFailed("SubmitGuardFailed", "guard", {}, 0)
        if not intent.ok:
            found = (intent.doc or {}).get(record.strip("/")) or {}
            if worker:
                found = ((intent.doc or {}).get("worker_submissions") or {}).get(token) or {}
            if found.get("status") == "submitted" and found.get("job_id"):
                return SubmittedJob(str(found["job_id"]), token, recovered=True)
            raise SubmissionInDoubt("SubmissionInDoubt", "record exists", {"record": found}, 0)
        # ... then sbatch, then the outcome
        doc = tr.document(self.store.snapshot().doc)
        successor = record == "/successor"
        if self.sbatch_error is not None:
            failed = (wt.worker_submit_failed if worker else st_succ.successor_submit_failed
                      if successor else tr.head_submit_failed)(
                doc, token=token, error=self.sbatch_error, rc=1)
            assert isinstance(failed, tr.Change)
            self.store.transact(failed.patch)
            raise SchedulerError(f"sbatch rejected job {spec.job_name!r}: {self.sbatch_error}")
        job_id = str(self.next_id)
        self.next_id += 1
        job = FakeJob(job_id, spec.job_name, token)
        self.jobs[job_id] = job
        if worker:  # the agent writes on_submitted's record in the same transaction
            assert on_submitted is not None and on_submitted[0] == wt.WORKERS + "/{job_id}"
            done = wt.worker_submitted(doc, token=token, job_id=job_id)
        else:
            done = (st_succ.successor_submitted if successor else tr.head_submitted)(
                doc, token=token, job_id=job_id)
        assert isinstance(done, tr.Change)
        assert self.store.transact(done.patch).ok
        if self.on_submit is not None:
            self.on_submit(job)
        return SubmittedJob(job_id, token)

    def write_files(self, files: Mapping[str, tuple[str | bytes, int]]) -> None:
        self._count("write_files")
        for path, (content, _mode) in files.items():
            self.files[path] = content if isinstance(content, str) else content.decode()
        if self.on_write is not None:
            self.on_write(files)

    def active_steps(self, job_id: str) -> list[str]:
        self._count("active_steps")
        return list(self.steps.get(job_id, []))

    def _snapshot(self, job_names: Sequence[str], known_ids: Sequence[str] = ()) -> StatusSnapshot:
        if not self.queue_answers:
            return StatusSnapshot(self.clock.wall(), False, {}, {}, {}, (), "squeue failed")
        # squeue still lists a job that just ended (until MinJobAge), with its final state
        queue = {job.job_id: _record(job) for job in self.jobs.values() if job.name in job_names}
        absent = tuple(j for j, job in self.jobs.items() if job.name not in job_names)
        absent += tuple(j for j in known_ids if j not in self.jobs)  # left the queue
        return StatusSnapshot(self.clock.wall(), True, queue, {}, {}, absent)

    def queue(self, job_names: Sequence[str], known_ids: Sequence[str] = ()) -> StatusSnapshot:
        self._count("squeue")
        return self._snapshot(job_names, known_ids)

    def poll_ready(self, job_name: str, job_id: str, *, with_status: bool) -> ReadyPoll:
        self._count("poll_ready")
        job = self.jobs.get(job_id)
        status = None
        if with_status:
            self._count("squeue")
            status = self._snapshot([job_name])
        return ReadyPoll(job.ready if job is not None else None, status)

    def poll_files(self, job_name: str, job_id: str, paths: Sequence[str], *,
                   with_status: bool) -> FilesPoll:
        self._count("poll_files")
        if with_status:
            self._count("poll_files_with_squeue")
        status = self._snapshot([job_name]) if with_status else None
        return FilesPoll({path: self._file_text(path) for path in paths}, status)

    def _file_text(self, path: str) -> str | None:
        """A file's text: the step server's markers from their tables, else ``files``."""
        job_id = path.rstrip("/").split("/")[-2]
        for suffix, table in (("/drained", self.drained), ("/ray_stopped", self.ray_stopped)):
            if path.endswith(suffix):
                return table[job_id] + "\n" if job_id in table else None
        return self.files.get(path)

    def beat(self, change: tr.Change, content: str) -> None:
        self._count("beat")
        self.store.transact(change.patch)
        self.beats.append(content)

    def cancel(self, job_ids: Sequence[str] = (), *, job_name: str | None = None) -> None:
        self._count("scancel")
        for job in self.jobs.values():
            if (job.job_id in job_ids or job.name == job_name) and job.state.active:
                job.state = JobState.CANCELLED
                self.cancelled.append(job.job_id)

    def signal_steps(self, job_id: str, signal: str) -> bool:
        self._count("signal_steps")
        if not self.queue_answers:
            raise SchedulerError("scancel: the controller does not answer")
        job = self.jobs.get(job_id)
        if job is None or not job.state.active:
            return False
        self.step_signals.append((job_id, signal))
        return True

    def signal_batch(self, job_id: str, signal: str,
                     files: Mapping[str, tuple[str | bytes, int]] | None = None) -> bool:
        self._count("signal_batch")
        if not self.queue_answers:
            raise SchedulerError("scancel: the controller does not answer")
        for path, (content, _mode) in (files or {}).items():
            self.files[path] = content if isinstance(content, str) else content.decode()
        job = self.jobs.get(job_id)
        if job is None or not job.state.active:
            return False
        self.signals.append((job_id, signal, self.doc()))
        if self.on_signal is not None:
            self.on_signal(job, signal)
        return True

    def accounting(self, job_ids: Sequence[str]) -> dict[str, SacctRecord]:
        self._count("sacct")
        if not self.accounting_answers:
            return {}
        return {job_id: _sacct(self.jobs[job_id]) for job_id in job_ids if job_id in self.jobs}

    def tail(self, path: str, lines: int) -> str:
        return "\n".join(self.files.get(path, "").splitlines()[-lines:])

    def observe(self, lease_patch: Sequence[Mapping[str, Any]] | None) -> Observation:
        self._count("observe")
        lease_ok = lease_doc = None
        if lease_patch is not None:
            txn = self.store.transact(list(lease_patch))
            lease_ok, lease_doc = txn.ok, txn.doc
            if not txn.ok:
                return Observation(tr.document(txn.doc, str(self.initial["job_name"])),
                                   unobserved(txn.now), {}, txn.now, False, txn.doc)
        snap = self.store.snapshot()
        doc = tr.document(snap.doc, str(self.initial["job_name"]))
        known = [] if doc is None else [
            *(r.job_id for r in (doc.allocation, doc.successor) if r is not None and r.job_id),
            *(j for j, w in doc.workers.items() if not w.released)]
        status = self._snapshot([str(self.initial["job_name"])], known)
        if status.certain:
            status = dataclasses.replace(status, accounting=self.accounting(
                [j for j in status.absent if j in self.jobs]))
        return Observation(doc, status, dict(self.files), snap.now, lease_ok, lease_doc)

    def act(self, steps: Sequence[Step]) -> list[StepOutcome]:
        self._count("act")
        self.acts.append(list(steps))
        outcomes: list[StepOutcome] = []
        for step in steps:
            if step.after is not None and not outcomes[step.after].ok:
                outcomes.append(StepOutcome(False, skipped=True, error="skipped"))
                continue
            outcomes.append(self._step(step))
        return outcomes

    def _step(self, step: Step) -> StepOutcome:
        if isinstance(step, Txn):
            result = self.store.transact(list(step.patch))
            return StepOutcome(result.ok, doc=result.doc,
                               error=None if result.ok else f"conflict: {result.conflict}")
        if isinstance(step, Cancel):
            if not self.queue_answers:
                return StepOutcome(False, error="scancel: the controller does not answer")
            gone = all(j not in self.jobs or not self.jobs[j].state.active for j in step.job_ids)
            self.cancel(list(step.job_ids))
            return StepOutcome(not gone, gone=gone)
        if isinstance(step, Signal):
            try:
                sent = self.signal_batch(step.job_id, step.signal, step.files)
            except SchedulerError as exc:
                return StepOutcome(False, error=str(exc))
            return StepOutcome(sent, gone=not sent)
        if self.lose_submit_answer:
            self.lose_submit_answer = False
            decided = wt.submit_worker(tr.document(self.store.snapshot().doc), token=step.token,
                                       config=step.record_value.get("config", {}), shape={},
                                       intent=step.record_value.get("intent"))
            assert isinstance(decided, tr.Change)
            patch = [dict(op) for op in decided.patch]
            for op in patch:  # the record as the agent writes it, with the extra fields
                if op.get("op") == "add" and op.get("path") == f"{wt.SUBMISSIONS}/{step.token}":
                    op["value"] = dict(step.record_value, token=step.token, status="submitting")
            assert self.store.transact([*step.guards, *patch]).ok
            job_id = str(self.next_id)
            self.next_id += 1
            self.jobs[job_id] = FakeJob(job_id, str(self.initial["job_name"]), step.token)
            raise TransportError("the connection was cut after sbatch")
        try:
            job = self.submit(step.spec, files=step.files, token=step.token,
                              record_value=step.record_value, create=step.create,
                              record=step.record, guards=step.guards,
                              on_submitted=step.on_submitted)
        except (SubmitGuardFailed, SubmissionInDoubt, SchedulerError) as exc:
            return StepOutcome(False, error=f"{type(exc).__name__}: {exc}")
        return StepOutcome(True, job_id=job.job_id)

    def read_lines(self, path: str) -> list[str]:
        self._count("read_lines")
        job_id = path.rstrip("/").split("/")[-2]
        if path.endswith("/drained"):
            return [self.drained[job_id]] if job_id in self.drained else []
        if path.endswith("/ray_stopped"):
            return [self.ray_stopped[job_id]] if job_id in self.ray_stopped else []
        job = self.jobs.get(job_id)
        return list(job.nodes) if job is not None else []

    # -- scripting -------------------------------------------------------------------------
    def start(self, job_id: str, *, nodes: tuple[str, ...] = ("c1",),
              ray_address: str | None = None) -> None:
        """The job runs and its step server reports ready."""
        job = self.jobs[job_id]
        job.state, job.reason, job.nodes = JobState.RUNNING, None, nodes
        lines = [f"head={nodes[0]}"] + ([f"ray_address={ray_address}"] if ray_address else [])
        job.ready = "\n".join(lines) + "\n"

    def run_without_ready(self, job_id: str) -> None:
        job = self.jobs[job_id]
        job.state, job.reason, job.nodes = JobState.RUNNING, None, ("c1",)

    def end(self, job_id: str, state: JobState = JobState.COMPLETED) -> None:
        self.jobs[job_id].state = state

    def doc(self) -> dict[str, Any]:
        return self.store.snapshot().doc or {}


def _record(job: FakeJob) -> SqueueRecord:
    return SqueueRecord(
        job_id=job.job_id, name=job.name, state=job.state, raw_state=job.state.value,
        reason=job.reason, time_left_seconds=job.time_left, time_limit_seconds=600.0,
        start_time=None, end_time=None, node_list=",".join(job.nodes) or None,
        nodes=job.nodes, num_nodes=max(1, len(job.nodes)), tres_per_node=None,
        partition="cpu", cpus=2, min_memory_bytes=None, elapsed_seconds=0.0,
        comment=job.token, tres_alloc=job.tres,
    )


def _sacct(job: FakeJob) -> SacctRecord:
    return SacctRecord(
        job_id=job.job_id, name=job.name, state=job.state, raw_state=job.state.value,
        cancelled_by=None, exit_code=0 if job.state is JobState.COMPLETED else None,
        exit_signal=None, elapsed_seconds=1.0, max_rss_bytes=None, total_cpu_seconds=None,
        num_nodes=max(1, len(job.nodes)), node_list=",".join(job.nodes) or None,
        nodes=job.nodes, alloc_cpus=2, start_time=None, end_time=None,
    )


def on_fake_cluster(slurm: Any, run_id: str, config: Any, launcher: Any, *,
                    activation: str | None = None, cluster_class: type[FakeCluster] = FakeCluster,
                    **options: Any) -> tuple[Any, FakeCluster]:
    """A RunSession of ``run_id`` on a fresh in-memory cluster (``cluster_class``), on its
    fake clock, without a heartbeat thread; ``options`` go to the RunSession."""
    from dagster_slurm.session.session import RunSession

    probe = RunSession(slurm, run_id, config, launcher, activation=lambda: activation, **options)
    cluster = cluster_class(probe.initial_document())
    session = RunSession(slurm, run_id, config, launcher, activation=lambda: activation,
                         io=cluster, clock=cluster.clock.monotonic, sleep=cluster.clock.sleep,
                         **options, background=False)
    return session, cluster


class Lines:
    """A logger (``info`` / ``warning`` / ``error``) keeping ``(level, message)`` pairs."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def error(self, message: str) -> None:
        self.lines.append(("error", message))

    def text(self, level: str | None = None) -> str:
        """The messages (of ``level`` only, when given), one per line."""
        return "\n".join(message for lvl, message in self.lines if level in (None, lvl))
