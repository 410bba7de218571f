"""``SlurmAllocation``: one running allocation of a run session, and the steps run inside it.

A step is started by writing its files and a request file in one round trip; the
allocation's step server (``templates/session_server.sh``) claims the request and starts the
step with ``srun --overlap`` on the head node. The request's write (and a cancel's) also
writes one line to the server's wake FIFO, in the same agent operation, so that a server
that lists its request directory only every 2 s while idle starts the step at once; that
works when the agent runs on the allocation's head node host (a FIFO carries nothing
between hosts), otherwise the server's next listing finds the request, at most 2 s later. Waiting for a step reads its status and drain
files (one round trip each read; every ``poll_interval`` seconds at first, slowing to one
read every ``MAX_STEP_POLL_INTERVAL`` seconds for long steps) and asks the scheduler about
the allocation every ``allocation_check_interval`` seconds in the same round trip, so an
allocation that ends under a step is noticed within that interval.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster_slurm.agent import exec_op, read_op, tail_op, txn_op, write_file_op
from dagster_slurm.agent.results import TailRequest
from dagster_slurm.config_errors import warn_renamed
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.paths import InvocationPaths, safe_name
from dagster_slurm.scheduler.client import SlurmScheduler, parse_exit_code
from dagster_slurm.scheduler.pacing import PollBackoff
from dagster_slurm.session.core.errors import (
    RAY_STOPPED,
    REPLACED,
    REQUEUED,
    SlurmAllocationEnded,
    SlurmStepExecutionResult,
    SlurmStepFailed,
    allocation_ended,
)
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.published_allocation import refuse_published_allocation
from dagster_slurm.slurm.states import JobState
from dagster_slurm.state import transitions as tr

log = logging.getLogger("dagster_slurm.session")

#: Longest pause between two reads of a running step's status file (the first reads come
#: every ``poll_interval``; the pause grows by a quarter per read up to this).
MAX_STEP_POLL_INTERVAL = 2.0

#: The step's script in its invocation directory (written before the step is requested).
STEP_SCRIPT = "dagster_slurm_step.sh"
#: File in a step's invocation directory holding its Slurm step id (written by the step).
STEP_ID_FILE = "slurm_step_id"
#: First setup line of every step, run after the job script's signal traps are set and
#: before the payload starts: records the Slurm step id, which the step server needs to
#: send the drain signal to this step (and the step's accounting to find its line).
RECORD_STEP_ID = f"printf '%s\\n' \"${{SLURM_STEP_ID:-}}\" > {STEP_ID_FILE} 2>/dev/null"


def new_request_id() -> str:
    """A new id for a step request (16 hex digits)."""
    return uuid.uuid4().hex[:16]


def step_name_for(name: str) -> str:
    """The Slurm step name of a step launched with ``name``."""
    return safe_name(name, 80)


@dataclass(frozen=True)
class StepHandle:
    """A step requested from the step server: its request id, Slurm step name and files."""

    request_id: str
    name: str
    paths: InvocationPaths


class SlurmAllocation:
    """A run session's allocation: job id, nodes, Ray address; start and wait for steps.

    ``job_id``: the Slurm job id (``slurm_job_id``, the published package's name, is
    accepted with a deprecation warning). ``nodes``: its hosts, head first. ``ray_address``:
    ``host:port`` of the Ray cluster started in it, None when it has no Ray.
    ``drain_signal``: the signal a drain sends (``TERM`` unless configured). The published
    package's constructor form (``slurm_job_id=``, ``working_dir=``, ``config=``) is
    refused, saying where to get the allocation.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> SlurmAllocation:
        refuse_published_allocation(args, kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        scheduler: SlurmScheduler,
        paths: SessionPaths,
        job_name: str,
        job_id: str,
        *,
        nodes: tuple[str, ...] = (),
        head: str | None = None,
        ray_address: str | None = None,
        drain_signal: str = "TERM",
        poll_interval: float = 0.25,
        allocation_check_interval: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.scheduler = scheduler
        self.paths = paths
        self.job_name = job_name
        self.job_id = job_id
        self.nodes = nodes
        self.head = head
        self.ray_address = ray_address
        self.drain_signal = drain_signal
        self.poll_interval = poll_interval
        self.allocation_check_interval = allocation_check_interval
        self.clock = clock
        self.sleep = sleep

    @property
    def slurm_job_id(self) -> str:
        """The Slurm job id of the allocation: the published package's name of
        :attr:`job_id` (same value), with a deprecation warning."""
        warn_renamed("SlurmAllocation.slurm_job_id", "SlurmAllocation.job_id")
        return self.job_id

    def __repr__(self) -> str:
        return f"SlurmAllocation(job_id={self.job_id!r}, nodes={self.nodes!r}, ray_address={self.ray_address!r})"

    # -- live facts ------------------------------------------------------------------------
    def query_end_time(self) -> str | None:
        """When the scheduler currently expects the allocation to end, as Slurm prints it
        (``2026-11-30T14:02:11``, the cluster's local time): one squeue on every call. None
        when the scheduler gives no end time (or no longer lists the job). Use this, not the
        requested time_limit: backfill (``time_min``) and admins change it."""
        record = self.scheduler.status([self.job_name], [self.job_id], accounting=False).queue.get(self.job_id)
        if record is None or record.end_time is None:
            return None
        return record.end_time.isoformat(timespec="seconds")

    @property
    def end_time(self) -> str | None:
        """:meth:`query_end_time` (it runs squeue on every access); the property name of
        earlier releases."""
        return self.query_end_time()

    def state(self) -> JobState | None:
        """The allocation's scheduler state now (None when the scheduler does not say)."""
        return self.scheduler.status([self.job_name], [self.job_id],
                                     state_only=True).job(self.job_id).state

    def request_drain(self) -> None:
        """Send the drain signal to the allocation's batch shell (``scancel --batch
        --signal``): running steps receive it, later steps are not started (their result is
        drained with exit code 0). Draining is permanent for this allocation."""
        self.scheduler.cancel([self.job_id], signal=self.drain_signal, batch_only=True)
        try:
            self.scheduler.agent.run(self._txn(tr.request_drain(None, job_id=self.job_id)))
        except DagsterSlurmError as exc:  # the signal went out; the record is informational
            log.warning("drain of %s requested, but not recorded: %s", self.job_id, exc)

    def _txn(self, decided: tr.Outcome) -> Any:
        """The agent operation applying a transition decided without reading the document
        (its patch's guards make the check under the lock)."""
        assert isinstance(decided, tr.Change), decided
        return txn_op(self.paths.document, self.paths.lock, decided.patch)

    # -- steps -----------------------------------------------------------------------------
    def invocation(self, step_key: str) -> InvocationPaths:
        """Fresh invocation paths for a step of ``step_key`` in this allocation."""
        return self.paths.invocation(self.job_id, step_key)

    def launch(
        self,
        paths: InvocationPaths,
        script: str,
        *,
        name: str,
        files: Mapping[str, tuple[str | bytes, int]] | None = None,
        request_id: str | None = None,
        after: Mapping[str, str] | None = None,
        wake: bool = True,
    ) -> StepHandle:
        """Write the step's script and ``files`` and request the step, in one round trip;
        then, in the same round trip, the files of ``after`` (path -> text: the call's
        record), written only once the request is.

        ``wake``: write a line to the step server's wake FIFO once the request is written
        (False: the server finds the request by its own listing, within its idle interval
        of 2 s, as it does for a request written on another host).
        ``request_id``: the request's id (None: a new one, :func:`new_request_id`). Refused
        with :class:`SlurmAllocationEnded` (state ``REPLACED``) when the session no longer
        has this allocation as its current one (nothing is written then).
        """
        request_id = request_id or new_request_id()
        step_name = step_name_for(name)
        script_path = paths.file(STEP_SCRIPT)
        request = "\n".join(
            [script_path, paths.stdout, paths.stderr, paths.status, paths.drain, step_name,
             paths.file(STEP_ID_FILE)]
        ) + "\n"
        agent = self.scheduler.agent
        with agent.batch() as batch:
            current = batch.add(self._txn(tr.launch_step(None, job_id=self.job_id)))
            written = [batch.add(write_file_op(script_path, script, mode=0o600, makedirs=True),
                                 requires=[current])]
            for path, (content, mode) in (files or {}).items():
                written.append(batch.add(write_file_op(path, content, mode=mode, makedirs=True),
                                         requires=[current]))
            requested = batch.add(
                write_file_op(self.paths.request(self.job_id, request_id), request, makedirs=True,
                              wake=self.paths.wake(self.job_id) if wake else None),
                requires=[current, *written],
            )
            recorded = [batch.add(write_file_op(path, text, makedirs=True), requires=[requested])
                        for path, text in (after or {}).items()]
        if not current.result().ok:
            raise SlurmAllocationEnded(
                SlurmStepExecutionResult(self.job_id, step_name, None, allocation_state=REPLACED),
                "the session replaced this allocation before the step started; prepare the "
                "step again against the current allocation",
            )
        for item in [*written, requested, *recorded]:
            item.result()
        if wake and requested.result().woken is False:
            log.debug("step %s requested; the step server of %s was not woken (no reader of "
                      "its wake FIFO on the agent's host): its next listing finds the request",
                      step_name, self.job_id)
        return StepHandle(request_id, step_name, paths)

    def cancel_op(self, handle: StepHandle) -> Any:
        """The agent operation asking the step server to stop the step (TERM, then KILL
        after 10 s), for a batch of the caller's; it wakes the server like a request."""
        return write_file_op(self.paths.request(self.job_id, handle.request_id, "cancel"), "\n",
                             wake=self.paths.wake(self.job_id))

    def cancel_step(self, handle: StepHandle) -> None:
        """Ask the step server to stop the step (TERM, then KILL after 10 s)."""
        self.scheduler.agent.run(self.cancel_op(handle))

    def wait(
        self,
        handle: StepHandle,
        *,
        on_poll: Callable[[], None] = lambda: None,
        cancel_on_error: bool = True,
    ) -> SlurmStepExecutionResult:
        """Wait until the step has written its status, or the allocation has ended.

        Returns the result (exit code, drained, drain signal); raises
        :class:`SlurmAllocationEnded` when the allocation ended first. With
        ``cancel_on_error`` any other exception while waiting (run termination,
        KeyboardInterrupt) cancels the step before propagating; without it the caller
        cancels (:meth:`cancel_step_quietly`), as the Pipes runner's ``_terminate`` does.
        """
        files = [TailRequest(handle.paths.status, 0), TailRequest(handle.paths.drain, 0)]
        next_check = self.clock() + self.allocation_check_interval
        ended_state: str | None = None
        backoff = PollBackoff(initial=self.poll_interval, factor=1.25,
                              maximum=max(self.poll_interval, MAX_STEP_POLL_INTERVAL))
        try:
            while True:
                # After the allocation was seen ending, one more read of the status file
                # decides (the step may have written it just before); no squeue then.
                check = ended_state is None and self.clock() >= next_check
                with self.scheduler.agent.batch() as batch:
                    tail = batch.add(tail_op(files))
                    status = batch.add(self.scheduler.status_op(
                        [self.job_name], [self.job_id], accounting=False,
                        shared=True, state_only=True)) if check else None
                chunks = tail.result().files
                exit_code = parse_exit_code(chunks[0].data) if chunks[0].exists else None
                drain_signal = chunks[1].data.decode("utf-8", "replace").strip() or None \
                    if chunks[1].exists else None
                if exit_code is not None or (chunks[0].exists and ended_state is not None):
                    result = SlurmStepExecutionResult(
                        self.job_id, handle.name, exit_code, drain_signal is not None, drain_signal,
                    )
                    if ended_state is None and (result.drained or exit_code != 0):
                        self._raise_if_ending(result)
                    return result
                if ended_state is not None:
                    raise allocation_ended(
                        SlurmStepExecutionResult(
                            self.job_id, handle.name, None, drain_signal is not None,
                            drain_signal, allocation_state=ended_state, nodes=self.nodes,
                        ),
                        f"allocation {self.job_id} ended ({ended_state}) before the step "
                        f"{handle.name} wrote its exit status",
                    )
                if status is not None:
                    next_check = self.clock() + self.allocation_check_interval
                    now = batch.response.now if batch.response else None
                    ended_state = gone_state(self.scheduler.snapshot(status.result(), now),
                                             self.job_id)
                    if ended_state is not None:
                        continue
                on_poll()
                self.sleep(backoff.current)
                backoff.observe(False)
        except SlurmAllocationEnded:
            raise
        except BaseException:
            if cancel_on_error:
                self.cancel_step_quietly(handle)
            raise

    def _raise_if_ending(self, result: SlurmStepExecutionResult) -> None:
        """A step that reports a drain or a failure may have been stopped by the end of its
        allocation (``scancel`` of the allocation, its walltime): Slurm signals every step
        then, and with TERM as drain signal a cancel looks like a drain. One squeue decides:
        an allocation that is no longer RUNNING raises :class:`SlurmAllocationEnded` with
        its state and the step's result. A failed step of an allocation that still runs but
        is no longer the session's head (another head was elected or promoted: its driver
        lost its Ray head) raises it too, with ``allocation_state`` ``REPLACED``; so does a
        failed step of a running allocation whose Ray head stopped (its step server's
        ``ray_stopped`` marker), with ``RAY_STOPPED``. The session document and the marker
        are read in the same round trip. When squeue does not answer, the step's own report
        stands (logged): a drain is never turned into an error on an unknown."""
        stopped_path = self.paths.ray_stopped(self.job_id)
        try:
            with self.scheduler.agent.batch() as batch:
                status = batch.add(self.scheduler.status_op(
                    [self.job_name], [self.job_id], accounting=False, shared=True, fresh=True))
                document = batch.add(read_op(self.paths.document))
                marker = (batch.add(tail_op([TailRequest(stopped_path, 0, 4096)]))
                          if self.ray_address else None)
            now = batch.response.now if batch.response else None
            snapshot = self.scheduler.snapshot(status.result(), now)
        except DagsterSlurmError as exc:
            log.warning("allocation %s not checked after step %s reported %s (%s); the step's "
                        "own report stands", self.job_id, result.step_name,
                        "a drain" if result.drained else f"exit code {result.exit_code}", exc)
            return
        observed = snapshot.job(self.job_id)
        state = gone_state(snapshot, self.job_id) or (
            observed.state.value if observed.state is not None else None)
        if state == JobState.RUNNING.value and not result.drained and self._replaced(document):
            state = REPLACED
        elif state == JobState.RUNNING.value and not result.drained and _marked(marker):
            state = RAY_STOPPED
        elif state is None or state == JobState.RUNNING.value:
            return
        raise allocation_ended(
            dataclasses.replace(result, allocation_state=state, nodes=self.nodes),
            f"allocation {self.job_id} is {state}: it ended under step {result.step_name} "
            f"(which reported {'a drain' if result.drained else f'exit code {result.exit_code}'})",
        )

    def _replaced(self, document: Any) -> bool:
        """True when the session document (a read op's result) names another head: this
        allocation was replaced (a new head was elected or promoted) while its job runs, so
        a failed driver here lost its Ray head. False when the document is unreadable."""
        try:
            head = (document.result().doc or {}).get("allocation") or {}
        except DagsterSlurmError:
            return False
        other = head.get("job_id")
        return other is not None and str(other) != self.job_id

    def cancel_step_quietly(self, handle: StepHandle) -> None:
        """:meth:`cancel_step`, logging (not raising) when the request cannot be written:
        called while another error propagates, which matters more."""
        try:
            self.cancel_step(handle)
        except Exception as exc:  # noqa: BLE001 - logged; the original error propagates
            log.error("could not cancel step %s of allocation %s: %s; it ends with the "
                      "allocation", handle.name, self.job_id, exc)

    # -- low level: a command as a step, no Pipes ------------------------------------------
    def execute(
        self,
        command: list[str] | tuple[str, ...],
        *,
        name: str = "step",
        env: Mapping[str, str] | None = None,
        activation: str | None = None,
        raise_on_error: bool = True,
        on_poll: Callable[[], None] = lambda: None,
    ) -> SlurmStepExecutionResult:
        """Run ``command`` (an argv) as one step on the head node and wait for it
        (``on_poll``: called between polls, raises to stop waiting; the step is then cancelled).

        ``env`` is exported (``RAY_ADDRESS`` is added when the allocation has Ray);
        ``activation`` is sourced first. Returns the :class:`SlurmStepExecutionResult`; a
        drained step is returned whatever its exit code. Raises :class:`SlurmStepFailed`
        (with log tails) for an ordinary non-zero exit when ``raise_on_error`` and
        :class:`SlurmAllocationEnded` when the allocation ends under the step.
        """
        from dagster_slurm.launchers.base import ExecutionPlan, validate_env
        from dagster_slurm.launchers.bash import BashLauncher

        paths = self.invocation(name)
        variables = validate_env(dict(env or {}))
        if self.ray_address:
            variables.setdefault("RAY_ADDRESS", self.ray_address)
        plan = ExecutionPlan(
            payload=tuple(command), job_dir=paths.job_dir, status_file=paths.status,
            drain_file=paths.drain, mode="slurm", env=variables, activation=activation,
            drain_signal=self.drain_signal,
        )
        launcher = BashLauncher(pre_start_commands=[RECORD_STEP_ID])
        handle = self.launch(paths, launcher.render(plan), name=name)
        result = self.wait(handle, on_poll=on_poll)
        result = _with_tails(self, result, paths)
        if raise_on_error and not result.drained and result.exit_code not in (0, None):
            raise SlurmStepFailed(result, f"files in {paths.job_dir}")
        return result


def gone_state(snapshot: Any, job_id: str) -> str | None:
    """The state of a started allocation that no longer holds its nodes in this poll: its
    final state (:meth:`StatusSnapshot.ended_state`), or ``REQUEUED`` when it is waiting in
    the queue again (Slurm requeued it: it started, since steps only go to a running
    allocation); None while it runs or nothing is certain."""
    ended = snapshot.ended_state(job_id)
    if ended is not None:
        return ended
    observed = snapshot.job(job_id)
    if observed.state is not None and observed.state.pending:
        return REQUEUED
    return None


def last_lines(agent: Any, paths: Sequence[str], lines: int = 30) -> list[str]:
    """The last ``lines`` lines of each file in ``paths`` (one round trip; a missing file
    gives ``""``). Raises :class:`~dagster_slurm.errors.DagsterSlurmError` when the cluster
    cannot be asked."""
    with agent.batch() as batch:
        tails = [batch.add(exec_op(["tail", "-n", str(lines), "--", path], timeout=10))
                 for path in paths]
    return [tail.result().stdout for tail in tails]


def _with_tails(allocation: SlurmAllocation, result: SlurmStepExecutionResult,
                paths: InvocationPaths) -> SlurmStepExecutionResult:
    """``result`` with the last lines of the step's stdout and stderr (best effort)."""
    try:
        out, err = last_lines(allocation.scheduler.agent, [paths.stdout, paths.stderr])
    except DagsterSlurmError:
        return result
    return dataclasses.replace(result, stdout_tail=out, stderr_tail=err)


def parse_ready(text: str) -> dict[str, Any]:
    """The step server's ``ready`` file (``key=value`` lines) as a dict of strings."""
    values: dict[str, Any] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _marked(marker: Any) -> bool:
    """True when a batched tail of a marker file (None: not asked) found it with content;
    False when it is missing, empty or could not be read."""
    if marker is None:
        return False
    try:
        chunk = marker.result().files[0]
    except DagsterSlurmError:
        return False
    return chunk.exists and bool(chunk.data.strip())
