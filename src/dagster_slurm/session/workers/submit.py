"""Worker allocations of a run session: Slurm jobs whose nodes join the run's Ray cluster.

:meth:`RunSession.add_worker_allocation` and :meth:`RunSession.wait_for_worker_allocation`
call :func:`add_worker_allocation` and :func:`wait_for_worker_allocation` here.

* **Adding** returns once sbatch answered. The configuration is resolved first (fields left
  None inherit the session's first worker allocation or, without one, the head allocation:
  :func:`~dagster_slurm.session.core.worker_config.resolve_worker_config`). The job carries the
  session's job name (teardown's ``scancel --name`` ends it) and its token in ``--comment``;
  the agent's ``submit`` records the token under ``/worker_submissions/<token>`` before
  sbatch runs and the worker record ``/workers/<job id>`` with the job id, in one locked
  transaction each (:mod:`dagster_slurm.state.worker_transitions`). Its batch script
  (:mod:`dagster_slurm.session.workers.job_script`) joins the head named in the session's
  ``ray_head`` file, waiting for one if the job starts first.
* **Waiting** polls the job's ``nodes``, ``ray_nodes`` and ``state`` files together with
  squeue (one round trip per poll, backing off; once the job runs, the files alone every
  :data:`JOIN_POLL_INTERVAL` seconds between those polls), logs the pending reason and start estimate
  while the job is PENDING, and returns the Ray node ids once every node joined the same
  head, after recording them (``record_worker_joined``). A session whose head has not
  started yet gets it first (``session.ensure``), so waiting works before the run's first
  ``compute.run``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dagster_slurm.backoff import PollBackoff, StatusPace
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.jobs.pending import PendingTracker
from dagster_slurm.scheduler.client import new_token
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.job_handle import SessionJob
from dagster_slurm.session.core.step_server import render_server
from dagster_slurm.session.core.submission import (
    Fence,
    SubmitOutcome,
    guarded_submit,
    submit_request,
)
from dagster_slurm.session.core.worker_config import (
    SlurmWorkerAllocationConfig,
    resolve_worker_config,
)
from dagster_slurm.session.workers.job_script import RELEASED_PREFIX, worker_submission
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt
from dagster_slurm.state.schema import SessionDocument

if TYPE_CHECKING:
    from dagster_slurm.session.core.context import SessionContext


class WorkerAllocation(SessionJob):
    """A worker allocation of the session: ``job_id`` (also ``slurm_job_id``), its
    submission ``token`` and the resolved ``config`` it was submitted with."""

    def __init__(self, session: SessionContext, job_id: str, token: str,
                 config: SlurmWorkerAllocationConfig) -> None:
        super().__init__(session, job_id, token)
        self.config = config

    def __repr__(self) -> str:
        return (f"WorkerAllocation(job_id={self.job_id!r}, "
                f"partition={self.config.partition!r}, num_nodes={self.config.num_nodes!r})")


def first_worker(doc: SessionDocument | None) -> SlurmWorkerAllocationConfig | None:
    """The configuration of the session's first worker allocation (the earliest submitted
    worker record, released or not), as recorded (resolved); None without one."""
    if doc is None or not doc.workers:
        return None
    record = min(doc.workers.values(), key=lambda w: (w.submitted_at or 0.0, w.job_id))
    known = SlurmWorkerAllocationConfig.model_fields
    return SlurmWorkerAllocationConfig(**{k: v for k, v in record.config.items() if k in known})


def _shape(spec: SbatchSpec) -> dict[str, Any]:
    """The sbatch options of ``spec`` that describe the request (not its files)."""
    skip = {"job_name", "script_path", "output", "error", "chdir", "comment", "export"}
    return {key: value for key, value in dataclasses.asdict(spec).items()
            if key not in skip and value not in (None, False, (), [])}


# -- adding --------------------------------------------------------------------------------------
def prepare_worker_submission(session: SessionContext, resolved: SlurmWorkerAllocationConfig,
                              token: str) -> tuple[SbatchSpec, dict[str, tuple[str | bytes, int]],
                                                   dict[str, Any], dict[str, Any]]:
    """What submitting the worker allocation ``resolved`` (a resolved configuration) under
    ``token`` sends: its sbatch request, the files written first (batch script and the step
    server it starts when elected to host the head), the configuration snapshot recorded
    and the request's shape (its sbatch options). Pure rendering; the session's launcher
    must be a RayLauncher."""
    spec, files = worker_submission(paths=session.paths, job_name=session.job_name,
                                    launcher=session.launcher, config=resolved,
                                    activation=session.activation(), token=token,
                                    server_drain_signal=session.drain_signal)
    files[f"{session.paths.submit_dir(token)}/step_server.sh"] = _step_server(session, token)
    return spec, files, resolved.snapshot(), _shape(spec)


def add_worker_allocation(session: SessionContext, config: SlurmWorkerAllocationConfig,
                          logger: Any = None, *, fence: Fence | None = None) -> WorkerAllocation:
    """Submit a worker allocation of ``session``; see the module docstring. ``fence``: a
    lease the caller holds; the submission applies only while it is held."""
    from dagster_slurm.launchers.ray import RayLauncher

    out = ProgressLog(logger)
    launcher = session.launcher
    if not isinstance(launcher, RayLauncher):
        raise SessionError(
            f"the run session {session.job_name} uses {type(launcher).__name__}; worker "
            "allocations join a Ray cluster, so the session's launcher must be a RayLauncher "
            "(default_launcher=RayLauncher(...))")
    doc = session.io.read().doc
    if doc is not None and doc.closed:
        raise SessionError(tr.closed_message(doc, session.job_name))
    resolved = resolve_worker_config(config, first_worker(doc), session.queue)
    token = new_token()
    spec, files, snapshot, shape = prepare_worker_submission(session, resolved, token)
    decided = wt.submit_worker(doc, token=token, config=snapshot, shape=shape,
                               job_name=session.job_name)
    request = submit_request(
        session, decided, spec=spec, files=files, token=token,
        record=f"{wt.SUBMISSIONS}/{token}",
        record_value=wt.worker_submission_record(snapshot, shape),
        on_submitted=(f"{wt.WORKERS}/{{job_id}}", wt.worker_record_value(snapshot)),
        fence=fence)
    result = guarded_submit(session, request, "the worker allocation", out)
    if result.outcome is SubmitOutcome.IN_DOUBT:
        raise SessionError(f"the worker allocation's submission (token {token}) is in doubt; "
                           "session.list_worker_allocations() lists it once it is settled")
    if result.failure is not None:
        if fence is not None:
            raise SessionError(f"the worker allocation of {session.job_name} was not submitted: "
                               f"the lease {fence.name} was no longer held "
                               f"(or the session was closed): {result.failure.outcome()}")
        raise SessionError(f"the session {session.job_name} was closed while the worker "
                           f"allocation was being submitted: {result.failure.outcome()}")
    job = result.job
    assert job is not None
    out.info(f"Submitted worker allocation {job.job_id} ({session.job_name}, partition "
             f"{spec.partition or 'default'}, {spec.num_nodes or 1} node(s), "
             f"{resolved.gpus_per_node or 0} GPU(s) per node, time limit {spec.time_limit}); "
             f"its nodes join the run's Ray head, output in {session.paths.output_of(job.job_id)}")
    return WorkerAllocation(session, job.job_id, token, resolved)


# -- waiting -------------------------------------------------------------------------------------
def parse_ray_nodes(text: str | None) -> dict[str, tuple[str, str]]:
    """``ray_nodes`` as host -> (Ray node id, head job id); malformed lines are skipped."""
    joined: dict[str, tuple[str, str]] = {}
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) == 3:
            joined[fields[0]] = (fields[1], fields[2])
    return joined


def joined_ids(nodes: list[str], joined: dict[str, tuple[str, str]]) -> list[str] | None:
    """The Ray node ids of ``nodes`` in their order once every one joined the same head
    (None before that, or while the allocation's hosts are not known)."""
    if not nodes or any(host not in joined for host in nodes):
        return None
    if len({joined[host][1] for host in nodes}) != 1:
        return None
    return [joined[host][0] for host in nodes]


#: Seconds between reads of a running worker allocation's files while its nodes join: the
#: nodes announce their join in ``ray_nodes`` themselves, so this bounds how late the wait
#: sees it. Such a read is one round trip to the login node and no scheduler call; squeue is
#: asked at the backoff's pace only (to see the job end).
JOIN_POLL_INTERVAL = 0.2


def wait_for_worker_allocation(session: SessionContext, allocation: WorkerAllocation,
                               timeout: float | None = None, logger: Any = None) -> list[str]:
    """Block until every node of ``allocation`` joined the run's Ray head; their Ray node
    ids, in the order of the allocation's hosts. Raises :class:`SessionError` when the job
    ends (or releases itself) first, :class:`TimeoutError` after ``timeout`` seconds (None:
    no limit); the allocation stays in both cases.

    While the job is queued each poll reads its files and squeue (backing off from 1 s to
    10 s). Once it runs, its files are read every :data:`JOIN_POLL_INTERVAL` seconds
    without squeue, which is still asked at the backoff's pace: the scheduler sees no more
    calls than before, and the join is seen within a fifth of a second of the node's
    announcement."""
    out = ProgressLog(logger)
    job_id = allocation.job_id
    if session.current.current() is None:
        session.ensure(logger)  # the head, started if needed: the nodes join its Ray
    paths = session.paths
    files = [paths.nodes(job_id), paths.ray_nodes(job_id), paths.worker_state(job_id)]
    tracker = PendingTracker(job_id, session.pending, out.info)
    pace = StatusPace(PollBackoff(initial=1.0, maximum=10.0, factor=1.5))
    deadline = None if timeout is None else session.clock() + timeout
    said, seen = "", ""
    running = False
    while True:
        with_status = not running or pace.due(session.clock())
        polled = session.io.poll_files(session.job_name, job_id, files, with_status=with_status)
        nodes = [line.strip() for line in (polled.texts[files[0]] or "").splitlines()
                 if line.strip()]
        ids = joined_ids(nodes, parse_ray_nodes(polled.texts[files[1]]))
        word = (polled.texts[files[2]] or "").strip()
        if ids is not None:
            _record_joined(session, job_id, nodes, ids, out)
            out.info(f"Worker allocation {job_id} joined the run's Ray cluster: "
                     + ", ".join(f"{host} (Ray node {node})" for host, node in zip(nodes, ids, strict=True)))
            return ids
        if word.startswith(RELEASED_PREFIX):
            raise SessionError(f"the worker allocation {job_id} {word} before all its nodes "
                               f"joined; see {paths.output_of(job_id)}")
        if polled.status is not None:
            running, said = _judge_status(polled.status, job_id, word, said, tracker, out,
                                          paths.output_of(job_id), running)
        if deadline is not None and session.clock() >= deadline:
            raise TimeoutError(f"the nodes of worker allocation {job_id} did not all join within "
                               f"{timeout:g} s (state {word or 'not written yet'}); it stays "
                               "queued or running: wait again, or remove it")
        progress = f"{said}|{word}|{len(nodes)}"
        if with_status:
            # the job started, or its nodes moved on (written, joining): look again soon
            pace.asked(session.clock(), progress != seen)
        seen = progress
        delay = JOIN_POLL_INTERVAL if running else pace.until_due(session.clock())
        if deadline is not None:
            delay = min(delay, max(0.0, deadline - session.clock()))
        session.pause(delay, f"worker allocation {job_id}")


def _judge_status(snapshot: Any, job_id: str, word: str, said: str, tracker: PendingTracker,
                  out: ProgressLog, output: str, running: bool) -> tuple[bool, str]:
    """What squeue says of a worker allocation whose nodes have not all joined: whether it
    runs (``running`` when the scheduler did not answer) and the progress line said last.
    Raises :class:`SessionError` when the job ended."""
    if not snapshot.certain:
        out.warning(f"the scheduler did not answer ({snapshot.error}); still waiting for "
                    f"worker allocation {job_id}")
        return running, said
    ended = snapshot.ended_state(job_id)
    if ended is not None:
        raise SessionError(f"the worker allocation {job_id} ended ({ended}) before all "
                           f"its nodes joined; see {output}")
    observed = snapshot.job(job_id)
    tracker(observed)
    if observed.state is not JobState.RUNNING:
        return False, said
    now = (f"Worker allocation {job_id} runs; waiting for its nodes to join "
           f"(state {word or 'not written yet'})")
    if now != said:
        out.info(now)
    return True, now


def _record_joined(session: SessionContext, job_id: str, nodes: list[str], ids: list[str],
                   out: ProgressLog) -> None:
    """Record the join in the worker record (best effort: a record that changed meanwhile,
    e.g. a newer join or a drain, is left as it is)."""
    ray_node_ids = dict(zip(nodes, ids, strict=True))
    try:
        for _attempt in range(3):
            doc = session.io.read().doc
            record = doc.workers.get(job_id) if doc is not None else None
            if record is not None and record.ray_node_ids == ray_node_ids:
                return
            decided = wt.record_worker_joined(doc, job_id=job_id, nodes=nodes,
                                              ray_node_ids=ray_node_ids)
            if isinstance(decided, tr.Refused):
                out.warning(f"the join of worker allocation {job_id} was not recorded: "
                            f"{decided.reason}")
                return
            if session.io.apply(decided).ok:
                return
    except DagsterSlurmError as exc:
        out.warning(f"the join of worker allocation {job_id} was not recorded: {exc}")


def _step_server(session: SessionContext, token: str) -> tuple[str, int]:
    """The step server a worker allocation starts when it is elected to host the head
    (rendered like a head's; see ``templates/ray_worker.sh``)."""

    return render_server(session.paths, token, session.drain_signal,
                         session.config.heartbeat_timeout), 0o600
