"""``RunSession``: one Dagster run's shared allocation, as seen from one process.

Every process of a run (each step process under the multiprocess executor) builds its own
``RunSession`` for the run; they agree through the session document on the cluster
(``sessions/<run>/allocation.json``, changed only under its lock by the agent):

* **Exactly one allocation.** A process that finds no ``/allocation`` record submits with
  the agent's ``submit`` operation on the pointer ``/allocation``: the record (with the
  process's token) is written under the lock only if absent, then sbatch runs. Every other
  process gets a conflict and waits for the record's job id; a record of a dead submitter
  is settled by the token in squeue's comment column.
* **Reattachment.** A process (a retried step, a restarted supervisor) that finds a live
  allocation attaches to it; an allocation that ended after it had accepted steps is moved
  to ``/history/<job id>`` and replaced; one that ended before it accepted any step fails
  the step with the allocation's log tail (no resubmission loop).
* **Heartbeat.** While a process uses the session it writes ``/heartbeat`` (host, pid,
  login-node time) and touches the ``heartbeat`` file every ``heartbeat_interval`` seconds
  from one daemon thread, stopped by :meth:`RunSession.close`. The orphan sensor reads the
  former, the allocation's dead-man's switch the latter.
* **Teardown.** :meth:`RunSession.close` with ``cancel=True`` cancels every job carrying
  the session's job name (current allocation, anything pending) and marks the session
  closed, after which no process submits for it again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dagster_slurm.agent import tail_op, txn_op, write_file_op
from dagster_slurm.agent.exceptions import SubmissionInDoubt
from dagster_slurm.agent.results import TailRequest
from dagster_slurm.compute.errors import SlurmJobUnschedulable, SlurmSubmissionError
from dagster_slurm.errors import ConfigurationError, DagsterSlurmError, SchedulerError
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.launchers.script import render_template
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import new_token
from dagster_slurm.session.allocation import SlurmAllocation, last_lines, parse_ready
from dagster_slurm.session.config import SlurmRunAllocationConfig
from dagster_slurm.session.errors import (
    SessionError,
    SlurmAllocationEnded,
    SlurmStepExecutionResult,
)
from dagster_slurm.session.paths import SessionPaths, session_job_name
from dagster_slurm.state.schema import new_session_document
from dagster_slurm.state.store import AgentStateStore

log = logging.getLogger("dagster_slurm.session")

SERVER_TEMPLATE = "session_server.sh"
#: Seconds a ``submitting`` record may stay without a job id before its token is looked up.
SUBMIT_GRACE_SECONDS = 150.0
#: Seconds after which a failed submission record no longer fails new steps (a retry submits).
FAILED_RECORD_SECONDS = 60.0


def render_server(paths: SessionPaths, token: str, drain_signal: str, heartbeat_timeout: float | None) -> str:
    """The step server script of one submission (see ``templates/session_server.sh``)."""
    return render_template(SERVER_TEMPLATE, {
        "session_dir": paths.session_dir,
        "heartbeat_file": paths.heartbeat,
        "heartbeat_timeout": "" if heartbeat_timeout is None else str(int(heartbeat_timeout)),
        "drain_signal": drain_signal,
        "launch_dir": paths.submit_dir(token),
    })


def session_digest(queue: Any, config: SlurmRunAllocationConfig, launcher: ComputeLauncher,
                   environment: Any = None) -> str:
    """8 hex digits identifying an allocation's shape, launcher and environment settings
    (resources that differ in any of them get separate sessions)."""
    text = json.dumps(
        [queue.model_dump(mode="json"), config.snapshot(), type(launcher).__name__,
         launcher.model_dump(mode="json"), environment],
        sort_keys=True, default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class RunSession:
    """The run's shared allocation as used by this process; see the module docstring.

    ``activation`` returns the environment's activation script on the cluster (prepared on
    first use); ``environment`` describes the environment settings (JSON-able; part of the
    session's digest, so resources with other environments get other sessions).
    """

    def __init__(
        self,
        slurm: SlurmResource,
        run_id: str,
        config: SlurmRunAllocationConfig,
        launcher: ComputeLauncher,
        *,
        activation: Callable[[], str | None],
        pending: Any = None,
        poll_interval: float = 0.25,
        environment: Any = None,
    ) -> None:
        from dagster_slurm.compute.pending import DEFAULT_FATAL_REASONS
        from dagster_slurm.compute.slurm_runner import PendingPolicy, _drain_signal

        self.slurm = slurm
        self.run_id = run_id
        self.config = config
        self.launcher = launcher
        self.activation = activation
        self.pending = pending or PendingPolicy(DEFAULT_FATAL_REASONS)
        self.poll_interval = poll_interval
        self.queue = config.queue_for(slurm.queue)  # checks the combination
        self.digest = session_digest(self.queue, config, launcher, environment)
        self.paths = SessionPaths.create(slurm.base_path(), run_id, self.digest)
        self.job_name = session_job_name(run_id, self.digest)
        self.spec = self.queue.to_sbatch_spec(
            self.job_name, f"{self.paths.session_dir}/submit/allocation.sh",
            output=self.paths.output, error=self.paths.output, chdir=self.paths.session_dir,
        )
        self.drain_signal = _drain_signal(self.queue.signal_before_timeout) or "TERM"
        self.interrupted = False
        self._allocation: SlurmAllocation | None = None
        self._lock = threading.RLock()
        self._heartbeat: _Heartbeat | None = None
        self._closed = False
        self._used = False

    # -- the allocation --------------------------------------------------------------------
    @property
    def has_ray(self) -> bool:
        """True when the allocation starts a Ray cluster (its launcher is a RayLauncher)."""
        from dagster_slurm.launchers.ray import RayLauncher

        return isinstance(self.launcher, RayLauncher)

    @property
    def store(self) -> AgentStateStore:
        return AgentStateStore(
            self.slurm.agent(), self.paths.session_dir,
            initial=new_session_document(self.job_name, self.run_id),
        )

    @property
    def allocation(self) -> SlurmAllocation:
        """The current allocation, submitted or attached to (and started) on first use."""
        return self.ensure()

    def ensure(self, logger: Any = None) -> SlurmAllocation:
        """The allocation the run's steps use now: this process's cached one, else the one
        the session document names (attached to), else a new submission. Waits until it
        accepts steps, logging the scheduler's pending reason and start estimate."""
        with self._lock:
            if self._closed:
                raise SessionError(f"the run session {self.job_name} was closed in this process")
            if self._allocation is None:
                self._used = True
                self._start_heartbeat()
                self._allocation = self._acquire(_Log(logger))
            return self._allocation

    def execute_in_session(
        self,
        command: str | Sequence[str],
        *,
        name: str = "step",
        env: Mapping[str, str] | None = None,
        raise_on_error: bool = True,
        logger: Any = None,
    ) -> SlurmStepExecutionResult:
        """Run ``command`` (a string split like a shell would, or an argv) as one step of the
        current allocation, in the session's environment, without Pipes; see
        :meth:`SlurmAllocation.execute`. An allocation that ends under the step raises
        :class:`~dagster_slurm.session.errors.SlurmAllocationEnded` and is replaced for the
        next step."""
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ConfigurationError("command", command, "must name a program to run")
        allocation = self.ensure(logger)
        try:
            return allocation.execute(argv, name=name, env=env, activation=self.activation(),
                                      raise_on_error=raise_on_error)
        except SlurmAllocationEnded as ended:
            self.forget(allocation, ended.result.allocation_state)
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.interrupted = True
            raise

    def forget(self, allocation: SlurmAllocation, state: str | None = None) -> None:
        """Stop using ``allocation`` (it ended); the next step gets a new one."""
        with self._lock:
            if self._allocation is allocation:
                self._allocation = None
        self._retire(allocation.job_id, "job_id", state)

    def _acquire(self, out: _Log) -> SlurmAllocation:
        store = self.store
        while True:
            snap = store.snapshot()
            doc = snap.doc or {}
            if doc.get("closed_at"):
                raise SessionError(
                    f"the run session {self.job_name} was closed (the run's teardown cancelled "
                    "its allocation); no new allocation is submitted for it"
                )
            record = doc.get("allocation")
            if record is None:
                job_id, mine = self._submit(out)
                if job_id is None:
                    time.sleep(0.2)
                    continue
                allocation = self._await_ready(job_id, out, mine)
                if allocation is not None:
                    return allocation
                continue
            status, job_id = record.get("status"), record.get("job_id")
            if status == "submitted" and job_id:
                allocation = self._await_ready(str(job_id), out, False)
                if allocation is not None:
                    return allocation
                continue
            if status == "submitting":
                age = snap.now - float(record.get("submitted_at") or snap.now)
                if age < SUBMIT_GRACE_SECONDS:
                    time.sleep(0.3)
                    continue
                self._settle_in_doubt(record, out)
                continue
            finished = float(record.get("finished_at") or record.get("submitted_at") or 0)
            if snap.now - finished < FAILED_RECORD_SECONDS:
                raise SlurmSubmissionError(
                    f"the run allocation could not be submitted ({status}): "
                    f"{(record.get('error') or '').strip()}"
                )
            self._retire(record.get("token"), "token", status)

    def _submit(self, out: _Log) -> tuple[str | None, bool]:
        """Submit the allocation; ``(None, False)`` when another process is submitting."""
        token = new_token()
        submit_dir = self.paths.submit_dir(token)
        activation = self.activation()
        script, server = f"{submit_dir}/allocation.sh", f"{submit_dir}/step_server.sh"
        plan = ExecutionPlan(
            payload=("bash", server), job_dir=submit_dir, status_file=f"{submit_dir}/exit_status",
            drain_file=f"{submit_dir}/drain_signal", mode="slurm", activation=activation,
            num_nodes=self.spec.num_nodes or 1, drain_signal=self.drain_signal,
        )
        files: dict[str, tuple[str | bytes, int]] = {
            script: (self.launcher.render(plan), 0o600),
            server: (render_server(self.paths, token, self.drain_signal,
                                   self.config.heartbeat_timeout), 0o600),
            self.paths.heartbeat: (f"{socket.gethostname()} {os.getpid()}\n", 0o600),
        }
        spec = dataclasses.replace(self.spec, script_path=script)
        scheduler = self.slurm.scheduler()
        try:
            job = scheduler.submit(
                spec, state_path=self.paths.document, lock_path=self.paths.lock,
                record="/allocation", record_value={"kind": "head", "config": self.config.snapshot()},
                create=new_session_document(self.job_name, self.run_id), files=files, token=token,
            )
        except SubmissionInDoubt:
            return None, False
        except SchedulerError as exc:
            raise SlurmSubmissionError(str(exc)) from None
        except BaseException:
            from dagster_slurm.compute.slurm_runner import _cancel_by_token

            _cancel_by_token(scheduler, self.job_name, token, _ContextShim(out))
            raise
        if job.recovered:
            return job.job_id, False
        out.info(
            f"Submitted run allocation {job.job_id} ({self.job_name}, partition "
            f"{spec.partition or 'default'}, {spec.num_nodes or 1} node(s), time limit "
            f"{spec.time_limit}{', starts Ray' if self.has_ray else ''}); session files in "
            f"{self.paths.session_dir}"
        )
        return job.job_id, True

    def _await_ready(self, job_id: str, out: _Log, mine: bool) -> SlurmAllocation | None:
        """Wait until allocation ``job_id`` accepts steps. None: it had ended after serving
        steps (retired; the caller submits anew). Raises when it fails before that; an
        allocation this process submitted is cancelled when waiting for it fails."""
        watch = _ReadyWatch(self, job_id, out)
        try:
            while True:
                values = watch.poll()
                if values is _ENDED:
                    return None
                if values is not None:
                    return self._attached(job_id, values, out, mine)
                time.sleep(watch.delay)
        except SlurmJobUnschedulable:
            self._cancel_quietly(job_id, out)
            self._retire(job_id, "job_id", "CANCELLED")
            raise
        except SessionError:
            if mine or watch.running_since is not None:
                self._cancel_quietly(job_id, out)
            raise
        except BaseException:
            if mine:
                self._cancel_quietly(job_id, out)
            raise

    def _attached(self, job_id: str, values: dict[str, Any], out: _Log, mine: bool) -> SlurmAllocation:
        nodes = tuple(self._read_lines(self.paths.nodes(job_id)))
        allocation = SlurmAllocation(
            self.slurm.scheduler(), self.paths, self.job_name, job_id,
            nodes=nodes, head=values.get("head") or None,
            ray_address=values.get("ray_address") or None, drain_signal=self.drain_signal,
            poll_interval=self.poll_interval,
        )
        verb = "accepts steps" if mine else "found; attaching to it"
        out.info(
            f"Run allocation {job_id} {verb} (nodes {','.join(nodes) or '?'}"
            + (f", Ray at {allocation.ray_address}" if allocation.ray_address else "") + ")"
        )
        if mine:
            for line in self._log_tail(job_id, 200).splitlines():
                if line.startswith(("Ray head node web UI:", "To reach it from your machine:")):
                    out.info(line)
            try:
                self.store.transact([
                    {"op": "test", "path": "/allocation/job_id", "value": job_id},
                    {"op": "add", "path": "/allocation/nodes", "value": list(nodes)},
                    {"op": "add", "path": "/allocation/ray_address", "value": allocation.ray_address},
                    {"op": "add", "path": "/allocation/ready_at", "value_now": 0},
                ])
            except DagsterSlurmError as exc:
                log.warning("could not record the allocation's nodes: %s", exc)
        return allocation

    def _settle_in_doubt(self, record: dict[str, Any], out: _Log) -> None:
        """A ``submitting`` record whose submitter vanished: find its job by token."""
        token = record.get("token")
        snapshot = self.slurm.scheduler().status([self.job_name])
        for job_id, queued in snapshot.queue.items():
            if queued.comment == token:
                self.store.transact([
                    {"op": "test", "path": "/allocation/token", "value": token},
                    {"op": "add", "path": "/allocation/status", "value": "submitted"},
                    {"op": "add", "path": "/allocation/job_id", "value": job_id},
                ])
                out.info(f"Recovered run allocation {job_id} of an interrupted submission")
                return
        self._retire(token, "token", "unknown")

    def _retire(self, value: Any, key: str, state: str | None) -> None:
        """Move the ``/allocation`` record whose ``key`` is ``value`` to ``/history``."""
        if value is None:
            return
        store = self.store
        doc = store.snapshot().doc or {}
        record = doc.get("allocation")
        if not isinstance(record, dict) or record.get(key) != value:
            return
        entry = dict(record, final_state=state)
        name = str(record.get("job_id") or record.get("token"))
        store.transact([
            {"op": "test", "path": f"/allocation/{key}", "value": value},
            {"op": "setdefault", "path": "/history", "value": {}},
            {"op": "add", "path": f"/history/{name}", "value": entry},
            {"op": "add", "path": f"/history/{name}/ended_at", "value_now": 0},
            {"op": "remove", "path": "/allocation"},
        ])

    def cleanup_step(self, step_key: str) -> None:
        """Remove the invocation files ``step_key`` kept (``defer_cleanup=True``) in every
        allocation the session has had; submits nothing."""
        from dagster_slurm.agent import remove_op
        from dagster_slurm.compute.paths import safe_name

        doc = self.store.snapshot().doc or {}
        job_ids = {str(r.get("job_id")) for r in [doc.get("allocation") or {},
                                                   *(doc.get("history") or {}).values()]
                   if isinstance(r, dict) and r.get("job_id")}
        if not job_ids:
            return
        with self.slurm.agent().batch() as batch:
            for job_id in sorted(job_ids):
                step_dir = f"{self.paths.steps_dir(job_id)}/{safe_name(step_key, 100)}"
                batch.add(remove_op(step_dir, root=self.paths.session_dir))

    # -- heartbeat and teardown ------------------------------------------------------------
    def beat(self) -> None:
        """One heartbeat: ``/heartbeat`` in the document and the heartbeat file's mtime."""
        host, pid = socket.gethostname(), os.getpid()
        agent = self.slurm.agent()
        with agent.batch() as batch:
            batch.add(txn_op(
                self.paths.document, self.paths.lock,
                [{"op": "add", "path": "/heartbeat", "value": {"host": host, "pid": pid, "at": 0}},
                 {"op": "add", "path": "/heartbeat/at", "value_now": 0}],
                create=new_session_document(self.job_name, self.run_id),
            ))
            batch.add(write_file_op(self.paths.heartbeat, f"{host} {pid}\n", makedirs=True))

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self.beat()
            self._heartbeat = _Heartbeat(self, self.config.heartbeat_interval)
            self._heartbeat.start()

    def close(self, *, cancel: bool, reason: str = "", logger: Any = None) -> None:
        """Stop the heartbeat; with ``cancel``, cancel every job of the session's name and
        mark the session closed (also when this process never used the allocation)."""
        with self._lock:
            self._closed = True
            heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()
        if cancel:
            self.cancel_all(reason, logger)

    def cancel_all(self, reason: str = "", logger: Any = None) -> None:
        """``scancel --name=<session job name>`` and mark the session closed."""
        out = _Log(logger)
        try:
            self.slurm.scheduler().cancel(job_name=self.job_name)
            if not self._used:
                return  # this process never touched the session: leave no document behind
            self.store.transact([
                {"op": "add", "path": "/closed_at", "value_now": 0},
                {"op": "add", "path": "/closed_reason", "value": reason or "teardown"},
            ])
            out.info(f"Cancelled the run allocation(s) of {self.job_name}"
                     + (f" ({reason})" if reason else ""))
        except DagsterSlurmError as exc:
            out.error(f"could not cancel the run allocation(s) of {self.job_name}: {exc}; "
                      f"cancel them with `scancel --name={self.job_name}`")

    def _cancel_quietly(self, job_id: str, out: _Log) -> None:
        try:
            self.slurm.scheduler().cancel([job_id])
            out.warning(f"Cancelled run allocation {job_id}")
        except DagsterSlurmError as exc:
            out.error(f"could not cancel run allocation {job_id}: {exc}; run `scancel {job_id}`")

    def _log_tail(self, job_id: str, lines: int = 30) -> str:
        try:
            (text,) = last_lines(self.slurm.agent(), [self.paths.output_of(job_id)], lines)
        except DagsterSlurmError as exc:
            return f"(unreadable: {exc})"
        return text.rstrip() or "(empty)"

    def _read_lines(self, path: str) -> list[str]:
        chunk = self.slurm.agent().run(tail_op([TailRequest(path, 0, 65536)])).files[0]
        return [line for line in chunk.data.decode("utf-8", "replace").splitlines() if line.strip()]


_ENDED: Any = object()


class _ReadyWatch:
    """One allocation being waited for: each :meth:`poll` is one round trip (the step
    server's ready file, with squeue when due)."""

    CHECK_INTERVAL = 2.0

    def __init__(self, session: RunSession, job_id: str, out: _Log) -> None:
        from dagster_slurm.compute.slurm_runner import _PendingTracker

        self.session = session
        self.job_id = job_id
        self.out = out
        self.tracker = _PendingTracker(job_id, session.pending, out.info)
        self.running_since: float | None = None
        self.next_check = 0.0
        self.delay = 0.25

    def poll(self) -> dict[str, Any] | None:
        """The ready file's values once it exists; ``_ENDED`` when the allocation ended
        after accepting steps (retired); None while waiting. Raises when it failed.

        While the allocation is pending every poll asks squeue (for its reason); once it
        runs, the ready file is read every poll and squeue every ``CHECK_INTERVAL`` seconds,
        and always before a ready file is trusted (it may be an ended allocation's)."""
        session, job_id = self.session, self.job_id
        scheduler = session.slurm.scheduler()
        check = self.running_since is None or time.monotonic() >= self.next_check
        with scheduler.agent.batch() as batch:
            status = batch.add(scheduler.status_op([session.job_name], [job_id])) if check else None
            ready = batch.add(tail_op([TailRequest(session.paths.ready(job_id), 0, 65536)]))
        chunk = ready.result().files[0]
        is_ready = chunk.exists and chunk.eof and chunk.data.endswith(b"\n")
        if status is None:
            if is_ready:
                self.next_check, self.delay = 0.0, 0.0
            return None
        self.next_check = time.monotonic() + self.CHECK_INTERVAL
        snapshot = scheduler.snapshot(status.result(), batch.response.now if batch.response else None)
        observed = snapshot.job(job_id)
        state = snapshot.ended_state(job_id)
        ended = state is not None
        if is_ready:
            if ended:
                session._retire(job_id, "job_id", state)
                self.out.info(f"Run allocation {job_id} has ended ({state}); submitting a new one")
                return _ENDED
            return parse_ready(chunk.data.decode("utf-8", "replace"))
        if ended:
            tail = session._log_tail(job_id)
            session._retire(job_id, "job_id", state)
            raise SessionError(
                f"run allocation {job_id} ended ({state}) before it accepted steps; its "
                f"log {session.paths.output_of(job_id)} ends with:\n{tail}"
            )
        self.tracker(observed)
        if observed.state is not None and observed.state.active and not observed.state.pending:
            self._running()
        else:
            self.delay = min(max(self.delay, 0.25) * 1.5, 5.0)
        return None

    def _running(self) -> None:
        session = self.session
        if self.running_since is None:
            self.running_since = time.monotonic()
            self.out.info(f"Run allocation {self.job_id} is running; waiting for it to accept "
                          f"steps{' (starting Ray)' if session.has_ray else ''}")
        if time.monotonic() - self.running_since > session.config.startup_timeout:
            raise SessionError(
                f"run allocation {self.job_id} did not accept steps within "
                f"{session.config.startup_timeout:g} s of starting (startup_timeout); its log "
                f"ends with:\n{session._log_tail(self.job_id)}"
            )
        self.delay = 0.25


class _Heartbeat(threading.Thread):
    """Calls ``session.beat()`` every ``interval`` seconds until stopped (a daemon thread)."""

    def __init__(self, session: RunSession, interval: float) -> None:
        super().__init__(name=f"dagster-slurm-heartbeat-{session.job_name}", daemon=True)
        self.session = session
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.session.beat()
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried next interval
                log.warning("heartbeat of %s failed: %s", self.session.job_name, exc)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


class _Log:
    """Progress lines to a Dagster logger (``context.log``) when given, else to ``logging``."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def _emit(self, level: str, message: str) -> None:
        getattr(self.logger if self.logger is not None else log, level)(message)

    def info(self, message: str) -> None:
        self._emit("info", message)

    def warning(self, message: str) -> None:
        self._emit("warning", message)

    def error(self, message: str) -> None:
        self._emit("error", message)


class _ContextShim:
    """What ``_cancel_by_token`` expects of a context: ``.log``."""

    def __init__(self, out: _Log) -> None:
        self.log = out

