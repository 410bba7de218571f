"""A multi-partition run in slurm mode (asset scope): one job array, a task per key.

Round trips: one to write every file and submit the first array (each task's Pipes context,
the tasks file, the script, the payload, the heartbeat file, sbatch --array); per poll, one
squeue of the step's job name (every task of the array in one answer: started tasks as
``<array>_<index>``, the pending rest folded into one line, see
:func:`~dagster_slurm.slurm.arrays.fold_array_queue`; it also rewrites the heartbeat file
all tasks' dead-man's switch watches) and one read of the new bytes of the started tasks'
messages and exit-status files; one sacct of the whole array (and the cleanup) at the end.
So the scheduler RPCs of a run do not grow with the number of keys.

Keys beyond the cluster's ``MaxArraySize`` (read once per process from
``scontrol show config``) go into further arrays of the same script, each submitted once the
previous one has no task left waiting in the queue. Interruption (run termination,
KeyboardInterrupt), an ended run or any failure while waiting cancels every array of the
run in one scancel. ``retries`` resubmits only the failed indices, as a new array, up to that
many times before the step fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import OpExecutionContext

from dagster_slurm.agent import exec_op, tail_op, write_file_op
from dagster_slurm.agent.results import TailRequest
from dagster_slurm.compute.array_attach import (
    FINISHED_FILE,
    EarlierArray,
    find_earlier_array,
    keys_digest,
)
from dagster_slurm.compute.array_poll import ArrayPoll, TaskSeen
from dagster_slurm.errors import LoginRequired, SchedulerError
from dagster_slurm.jobs.array_files import ArrayLayout, PartitionTask, tasks_file_content
from dagster_slurm.jobs.array_tasks import ArrayInvocation, ArrayProgress, TaskEnd
from dagster_slurm.jobs.cancel import keep_after_lost_login
from dagster_slurm.jobs.contexts import step_identity
from dagster_slurm.jobs.cost import (
    DEFAULT_EFFICIENCY_WARNING,
    efficiency_warning,
    requested_memory_bytes,
    run_summary,
)
from dagster_slurm.jobs.errors import SlurmSubmissionError
from dagster_slurm.jobs.files import remove_invocation
from dagster_slurm.jobs.follow import DEFAULT_RUN_STATUS_INTERVAL, follower_for
from dagster_slurm.jobs.metrics import from_sacct
from dagster_slurm.jobs.partitions import partition_context_data, step_context_data
from dagster_slurm.jobs.paths import InvocationPaths, job_name_for
from dagster_slurm.jobs.pending import PendingPolicy
from dagster_slurm.jobs.runner import JobRequest
from dagster_slurm.jobs.signals import drain_signal_of
from dagster_slurm.launchers.base import ExecutionPlan, PayloadSpec, payload_argv
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.scheduler.client import SlurmScheduler, new_token, parse_exit_code
from dagster_slurm.scheduler.watcher import heartbeat_content
from dagster_slurm.slurm.arrays import (
    ArrayChunk,
    array_expression,
    fold_array_accounting,
    max_array_size,
    split_for_arrays,
)
from dagster_slurm.slurm.commands import SbatchSpec

__all__ = ["SlurmArrayRunner"]

#: Bytes of a failed task's stdout and stderr read for the step's error.
TAIL_BYTES = 16 * 1024


@dataclass
class _Array:
    """One submitted job array: its chunk of the run's keys and its task index -> position."""

    chunk: ArrayChunk
    spec: SbatchSpec
    number: int
    """Which of the run's scripts and tasks files it runs (a retry: its original's)."""
    job_id: str | None = None
    positions: dict[int, int] = field(default_factory=dict)
    """Task index -> key position, for the tasks whose outcome this array decides (a
    position retried elsewhere is removed)."""


class SlurmArrayRunner:
    """Runs a payload once per partition key as the tasks of Slurm job arrays."""

    def __init__(self, slurm: SlurmResource, pending: PendingPolicy,
                 prepare_env: Callable[[OpExecutionContext], str | None], *,
                 run_status_interval: float = DEFAULT_RUN_STATUS_INTERVAL,
                 heartbeat_timeout: float | None = None,
                 efficiency_warning_below: float | None = DEFAULT_EFFICIENCY_WARNING) -> None:
        self.efficiency_warning_below = efficiency_warning_below
        self.slurm = slurm
        self.pending = pending
        self.prepare_env = prepare_env
        self.run_status_interval = run_status_interval
        self.heartbeat_timeout = heartbeat_timeout

    def run(self, context: OpExecutionContext, request: JobRequest, keys: Sequence[str],
            parallelism: int | None, retries: int = 0) -> ArrayInvocation:
        """Run ``request`` once per key of ``keys`` as job arrays (see the module
        docstring); raises :class:`~dagster_slurm.jobs.array_tasks.SlurmArrayTasksFailed`
        naming the keys whose tasks failed (after ``retries`` resubmissions of them)."""
        scheduler = self.slurm.scheduler()
        run_id, step_key = step_identity(context)
        paths = InvocationPaths.create(self.slurm.base_path(), run_id, step_key)
        digest = keys_digest(keys)
        earlier = find_earlier_array(scheduler.agent, paths.step_dir, digest)
        if earlier is not None:
            paths = InvocationPaths(paths.base, paths.run_dir, paths.step_dir, earlier.job_dir)
        job_name = job_name_for(run_id, step_key)
        max_size = max_array_size(scheduler.config())
        layout, tasks, payload, arrays = self._arrays(job_name, paths, keys, max_size, parallelism,
                                                    request)
        attach = earlier is not None and len(arrays) == 1
        if earlier is not None and not attach:
            context.log.warning(
                f"An earlier attempt of this step left job array {earlier.job_id} in "
                f"{earlier.job_dir}; a run of {len(arrays)} arrays is not attached to, so it "
                "is cancelled and the keys are submitted again")
            self._cancel(context, scheduler, [earlier.job_id], RuntimeError("resubmitted"))
            paths = InvocationPaths.create(self.slurm.base_path(), run_id, step_key)
            layout, tasks, payload, arrays = self._arrays(job_name, paths, keys, max_size,
                                                        parallelism, request)
        files = {} if attach else self._files(context, request, paths, layout, tasks, payload,
                                              self.prepare_env(context), arrays)
        progress = ArrayProgress(context, tasks)
        poll = ArrayPoll(scheduler, job_name, self.pending, context.log,
                         heartbeat=paths.heartbeat if self.heartbeat_timeout else None)
        if self.heartbeat_timeout is not None:
            poll.backoff.cap(self.heartbeat_timeout / 4)
        context.log.info(
            f"Running {len(tasks)} partitions as {len(arrays)} Slurm job array(s) of "
            f"{', '.join(str(a.chunk.size) for a in arrays)} task(s), at most "
            f"{parallelism or 'as many as the scheduler starts'} at once; files in {paths.job_dir}")
        follower = follower_for(context, self.run_status_interval)
        submitted: list[_Array] = []
        try:
            if attach:
                self._attach(context, poll, arrays[0], earlier)
            else:
                self._submit(context, scheduler, poll, arrays[0], paths, files, run_id, step_key,
                             follower, digest)
            submitted.append(arrays[0])
            queued = list(arrays[1:])
            attempts = 0
            while True:
                self._follow(context, scheduler, progress, poll, queued, submitted, paths,
                             run_id, step_key, follower)
                failed = sorted(progress.failures)
                if not failed or attempts >= retries:
                    break
                attempts += 1
                again = self._retry_arrays(job_name, paths, layout, submitted, failed,
                                           parallelism, request)
                context.log.warning(
                    f"Retry {attempts} of {retries}: submitting the {len(failed)} failed "
                    f"partition(s) again: {', '.join(repr(tasks[p].key) for p in failed)}")
                self._reset(scheduler, progress, [tasks[p] for p in failed])
                for retry in again:
                    self._submit(context, scheduler, poll, retry, paths, {}, run_id, step_key,
                                 follower)
                    submitted.append(retry)
        except BaseException as exc:
            self._cancel(context, scheduler, [a.job_id for a in submitted if a.job_id], exc,
                         finished=paths.file(FINISHED_FILE))
            raise
        self._finish(context, scheduler, progress, poll, submitted, paths, request)
        progress.raise_failures()
        return ArrayInvocation(tuple(progress.results()), progress.summary)

    # -- files and submission -------------------------------------------------------------
    def _arrays(self, job_name: str, paths: InvocationPaths, keys: Sequence[str], max_size: int,
              parallelism: int | None, request: JobRequest
              ) -> tuple[ArrayLayout, list[PartitionTask], PayloadSpec, list[_Array]]:
        """The run's tasks and arrays in ``paths`` (every sbatch spec built, so checked,
        before anything is submitted)."""
        layout = ArrayLayout(paths.job_dir)
        tasks = layout.tasks(list(keys))
        payload = payload_argv(request.payload_path, job_dir=paths.job_dir)
        arrays = [_Array(chunk, self._spec(job_name, paths, layout, n, chunk.size, parallelism,
                                           request), n,
                         positions={i: chunk.offset + i for i in range(chunk.size)})
                  for n, chunk in enumerate(split_for_arrays(len(tasks), max_size))]
        return layout, tasks, payload, arrays

    def _spec(self, job_name: str, paths: InvocationPaths, layout: ArrayLayout, n: int,
              size: int, parallelism: int | None, request: JobRequest,
              indices: Sequence[int] | None = None) -> SbatchSpec:
        out = paths.file(f"array-{n}.out")
        return self.slurm.queue.to_sbatch_spec(
            job_name, layout.script(n), output=out, error=out, chdir=paths.job_dir,
            array=array_expression(indices if indices is not None else range(size), parallelism),
            **request.overrides)

    def _plan(self, request: JobRequest, paths: InvocationPaths, payload: PayloadSpec,
              activation: str | None, tasks_file: str, num_nodes: int) -> ExecutionPlan:
        return ExecutionPlan(
            payload=payload.argv, job_dir=paths.job_dir, status_file=paths.status,
            drain_file=paths.drain, mode="slurm", env=dict(request.extra_env),
            activation=activation, num_nodes=num_nodes,
            drain_signal=drain_signal_of(self.slurm.queue.signal_before_timeout),
            heartbeat_file=paths.heartbeat if self.heartbeat_timeout is not None else None,
            heartbeat_timeout=self.heartbeat_timeout, restart_allowed=self.slurm.queue.requeue,
            array_tasks_file=tasks_file)

    def _files(self, context: OpExecutionContext, request: JobRequest, paths: InvocationPaths,
               layout: ArrayLayout, tasks: Sequence[PartitionTask], payload: PayloadSpec,
               activation: str | None, arrays: Sequence[_Array]) -> dict[str, tuple[str | bytes, int]]:
        step_data = step_context_data(context, request.extras)
        files: dict[str, tuple[str | bytes, int]] = {
            paths.heartbeat: (heartbeat_content(0), 0o600)}
        for task in tasks:
            data = partition_context_data(step_data, context, task.key)
            files[task.context] = (json.dumps(data), 0o600)
        for n, array in enumerate(arrays):
            chunk_tasks = tasks[array.chunk.offset:array.chunk.offset + array.chunk.size]
            files[layout.tasks_file(n)] = (tasks_file_content(chunk_tasks), 0o600)
            plan = self._plan(request, paths, payload, activation, layout.tasks_file(n),
                              array.spec.num_nodes or 1)
            files[layout.script(n)] = (request.launcher.render(plan), 0o600)
        if payload.needs_upload:
            assert payload.upload_from is not None and payload.upload_name is not None
            with open(payload.upload_from, "rb") as handle:
                files[paths.upload_target(payload.upload_name)] = (handle.read(), 0o600)
        return files

    def _attach(self, context: OpExecutionContext, poll: ArrayPoll, array: _Array,
                earlier: EarlierArray | None) -> None:
        """Follow the array of an earlier attempt instead of submitting one."""
        assert earlier is not None
        array.job_id = earlier.job_id
        poll.submitted(earlier.job_id)
        context.log.info(f"Reattached to Slurm job array {earlier.job_id}, submitted by an "
                         "earlier attempt of this step; its tasks are followed from where "
                         "they are")

    def _retry_arrays(self, job_name: str, paths: InvocationPaths, layout: ArrayLayout,
                      arrays: Sequence[_Array], failed: Sequence[int], parallelism: int | None,
                      request: JobRequest) -> list[_Array]:
        """New arrays of the ``failed`` positions: one per array of the run's first
        submission that holds some of them, with its script and tasks file (a position keeps
        its task index there)."""
        retries = []
        for array in arrays:
            for index in [i for i, p in array.positions.items() if p in failed]:
                del array.positions[index]  # decided by the retry from now on
        for original in [a for a in arrays if a.chunk.size]:
            mine = [p for p in failed if original.chunk.offset <= p
                    < original.chunk.offset + original.chunk.size]
            if not mine:
                continue
            indices = [p - original.chunk.offset for p in mine]
            spec = self._spec(job_name, paths, layout, original.number, 0, parallelism,
                              request, indices=indices)
            retries.append(_Array(ArrayChunk(original.chunk.offset, 0), spec, original.number,
                                  positions={i: original.chunk.offset + i for i in indices}))
        return retries

    def _submit(self, context: OpExecutionContext, scheduler: SlurmScheduler, poll: ArrayPoll,
                array: _Array, paths: InvocationPaths,
                files: dict[str, tuple[str | bytes, int]], run_id: str, step_key: str,
                follower: Any, digest: str | None = None) -> None:
        token = new_token()
        owner = {"run_id": run_id, "step_key": step_key, "job_name": array.spec.job_name,
                 "array": array.spec.array, "keys_sha256": digest}
        waits = self.slurm.limit_wait(
            context.log.info, lambda: follower.check(f"a free slot to submit {array.spec.job_name}"))
        try:
            submitted = scheduler.submit(array.spec, state_path=paths.record, files=files,
                                         token=token, record_value=owner, limit_wait=waits,
                                         record="/job" if files else f"/arrays/{token}")
        except SchedulerError as exc:
            raise SlurmSubmissionError(str(exc)) from None
        array.job_id = submitted.job_id
        poll.submitted(submitted.job_id)
        context.log.info(f"Submitted Slurm job array {submitted.job_id} ({array.spec.job_name}, "
                         f"--array={array.spec.array}, partition "
                         f"{array.spec.partition or 'default'}, time limit {array.spec.time_limit})")

    def _reset(self, scheduler: SlurmScheduler, progress: ArrayProgress,
               tasks: Sequence[PartitionTask]) -> None:
        """Forget the failed tasks' ends and remove their status and output files, so that
        their retry is read from the start."""
        with scheduler.agent.batch() as batch:
            for task in tasks:
                batch.add(exec_op(["rm", "-f", "--", task.status, task.messages, task.stdout,
                                   task.stderr]))
        progress.retry([t.position for t in tasks])

    # -- following ------------------------------------------------------------------------
    def _follow(self, context: OpExecutionContext, scheduler: SlurmScheduler,
                progress: ArrayProgress, poll: ArrayPoll, queued: list[_Array],
                submitted: list[_Array], paths: InvocationPaths, run_id: str, step_key: str,
                follower: Any) -> None:
        """Poll until every task of the submitted arrays has ended, submitting the next
        array of ``queued`` once the last submitted one has no task left waiting."""
        while True:
            current = {a.job_id: a for a in submitted if a.job_id}
            seen = poll.observe(current)
            self._read(scheduler, progress, seen, current)
            if queued and poll.drained(submitted[-1].job_id):
                following = queued.pop(0)
                self._submit(context, scheduler, poll, following, paths, {}, run_id, step_key,
                             follower)
                submitted.append(following)
                continue
            waiting = set(progress.open_positions)
            if not queued and not any(p in waiting for a in submitted
                                      for p in a.positions.values()):
                return
            follower.check(f"the Slurm job array(s) {', '.join(current)}")
            poll.pause(changed=bool(seen))

    def _read(self, scheduler: SlurmScheduler, progress: ArrayProgress,
              seen: Sequence[TaskSeen], arrays: dict[str, _Array]) -> None:
        """One read of the messages and exit-status files of the tasks that started or
        ended; the ended ones are finished (with their output tails when they failed)."""
        open_positions = set(progress.open_positions)
        tasks = [(s, progress.tasks[arrays[s.array_id].positions[s.index]]) for s in seen
                 if arrays[s.array_id].positions.get(s.index) in open_positions]
        if not tasks:
            return
        requests: list[TailRequest] = []
        for _, task in tasks:
            requests.append(TailRequest(task.messages, progress.messages_of(task.position).offset))
            requests.append(TailRequest(task.status, 0, 64))
        chunks = scheduler.agent.run(tail_op(requests)).files
        failed: list[tuple[TaskSeen, PartitionTask, int | None]] = []
        for n, (state, task) in enumerate(tasks):
            messages, status = chunks[2 * n], chunks[2 * n + 1]
            tailed = progress.messages_of(task.position)
            tailed.offset = messages.offset
            code = parse_exit_code(status.data) if status.exists else None
            ended = state.gone or (state.state is not None and state.state.terminal)
            progress.feed(task.position, messages.data, final=ended)
            if not ended:
                continue
            end = _task_end(state, code)
            if end.succeeded:
                progress.finish(task.position, end)
            else:
                failed.append((state, task, code))
        if failed:
            self._finish_failed(scheduler, progress, failed)

    def _finish_failed(self, scheduler: SlurmScheduler, progress: ArrayProgress,
                       failed: Sequence[tuple[TaskSeen, PartitionTask, int | None]]) -> None:
        requests = []
        for _, task, _ in failed:
            requests += [TailRequest(task.stdout, -TAIL_BYTES, TAIL_BYTES),
                         TailRequest(task.stderr, -TAIL_BYTES, TAIL_BYTES)]
        chunks = scheduler.agent.run(tail_op(requests)).files
        for n, (state, task, code) in enumerate(failed):
            out, err = chunks[2 * n], chunks[2 * n + 1]
            progress.finish(task.position, _task_end(state, code),
                            stdout_tail=out.data.decode("utf-8", "replace"),
                            stderr_tail=err.data.decode("utf-8", "replace"))

    # -- the end --------------------------------------------------------------------------
    def _finish(self, context: OpExecutionContext, scheduler: SlurmScheduler,
                progress: ArrayProgress, poll: ArrayPoll, submitted: Sequence[_Array],
                paths: InvocationPaths, request: JobRequest) -> None:
        """Accounting of every array in one sacct (each task's figures added to its
        partition) and, when every task succeeded, the removal of the files."""
        ids = [a.job_id for a in submitted if a.job_id]
        with scheduler.agent.batch() as batch:
            acct = batch.add(scheduler.accounting_op(ids))
            batch.add(write_file_op(paths.file(FINISHED_FILE), "finished\n"))
            if not progress.failures and not request.defer_cleanup:
                remove_invocation(batch, paths, paths.run_dir)
        records = scheduler.accounting_records(acct.result())
        requested = requested_memory_bytes(submitted[0].spec) if submitted else None
        for array in submitted:
            if array.job_id is None:
                continue
            for index, record in fold_array_accounting(records, array.job_id).items():
                position = array.positions.get(index)
                end = progress.ends.get(position) if position is not None else None
                if position is None or end is None or end.job_id != f"{array.job_id}_{index}":
                    continue
                metrics = from_sacct(end.job_id, record, end.exit_code, end.state, "squeue",
                                     requested_mem_bytes=requested,
                                     observed_wait=poll.queue_wait(array.job_id, index))
                progress.add_figures(position, metrics.as_metadata())
        progress.summary = {
            "dagster_slurm/mode": "slurm",
            "dagster_slurm/array_job_ids": ",".join(ids),
            "dagster_slurm/partitions": len(progress.tasks),
            "dagster_slurm/failed_partitions": len(progress.failures),
            **run_summary(end.figures for end in progress.ends.values()),
        }
        spec = submitted[0].spec if submitted else None
        warning = efficiency_warning(progress.summary, self.efficiency_warning_below,
                                     cpus=spec.cpus_per_task if spec else None,
                                     mem=(spec.mem or spec.mem_per_cpu) if spec else None)
        if warning is not None:
            context.log.warning(warning)

    def _cancel(self, context: OpExecutionContext, scheduler: SlurmScheduler,
                ids: Sequence[str], error: BaseException, finished: str | None = None) -> None:
        """Cancel every array of the run in one scancel (never raises: ``error`` matters
        more); a lost login leaves them as they are (see
        :func:`~dagster_slurm.jobs.cancel.keep_after_lost_login`)."""
        if not ids:
            return
        if isinstance(error, LoginRequired):
            keep_after_lost_login(context.log, f"job array(s) {', '.join(ids)}")
            return
        try:
            scheduler.cancel(list(ids))
            context.log.warning(f"Cancelled Slurm job array(s) {', '.join(ids)}")
            if finished is not None:  # not to be attached to by a retry of the step
                scheduler.agent.run(write_file_op(finished, "cancelled\n"))
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            context.log.error(f"could not cancel Slurm job array(s) {', '.join(ids)}: {exc}; "
                              f"cancel them with `scancel {' '.join(ids)}`")


def _task_end(seen: TaskSeen, code: int | None) -> TaskEnd:
    """A task's end from its squeue state and its exit-status file: the state as the
    scheduler gave it; a status file with a non-zero code makes a COMPLETED task FAILED."""
    if seen.state is None:  # gone from squeue: only the status file tells, else UNKNOWN
        state = "UNKNOWN" if code is None else ("COMPLETED" if code == 0 else "FAILED")
    else:
        state = seen.state.value
    if state == "COMPLETED" and code not in (0, None):
        state = "FAILED"
    job_id = f"{seen.array_id}_{seen.index}"
    return TaskEnd(job_id, state, code, {"dagster_slurm/mode": "slurm",
                                         "dagster_slurm/job_id": job_id,
                                         "dagster_slurm/state": state,
                                         "dagster_slurm/exit_code": code})
