"""A multi-partition run in local mode: the payload once per key, in a pool of processes.

The same job script as a Slurm job array's (:mod:`dagster_slurm.jobs.array_files`): each
process is started with ``SLURM_ARRAY_TASK_ID`` set to its key's position, so the script
finds its task directory, key and Pipes files exactly as a task of an array does. At most
``parallelism`` processes run at once; the next key starts as soon as one ends. Results per
partition are recorded by :class:`~dagster_slurm.jobs.array_tasks.ArrayProgress`.
Interruption (run termination, KeyboardInterrupt) ends every running process group (TERM,
then KILL after ``kill_grace`` seconds) and starts no further key.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dagster import OpExecutionContext

from dagster_slurm.agent.results import TailRequest
from dagster_slurm.compute.local_runner import (
    current_environment_path,
    default_local_base,
    terminate_groups,
)
from dagster_slurm.jobs.array_files import ArrayLayout, PartitionTask, tasks_file_content
from dagster_slurm.jobs.array_tasks import ArrayInvocation, ArrayProgress, TaskEnd
from dagster_slurm.jobs.contexts import step_identity
from dagster_slurm.jobs.cost import run_summary
from dagster_slurm.jobs.follow import DEFAULT_RUN_STATUS_INTERVAL, follower_for
from dagster_slurm.jobs.metrics import from_local
from dagster_slurm.jobs.partitions import partition_context_data, step_context_data
from dagster_slurm.jobs.paths import InvocationPaths
from dagster_slurm.jobs.runner import JobRequest
from dagster_slurm.launchers.base import ExecutionPlan, payload_argv
from dagster_slurm.pipes.sources import read_local_chunk
from dagster_slurm.scheduler.observations import parse_exit_code

__all__ = ["LocalArrayRunner"]

#: Bytes of a failed task's stdout and stderr read for the step's error.
TAIL_BYTES = 16 * 1024


@dataclass
class _Running:
    task: PartitionTask
    proc: subprocess.Popen
    started: float
    waited: float


class LocalArrayRunner:
    """Runs a payload once per partition key as local processes (see the module docstring).

    ``base``: directory of the invocation files (None: the local default); ``poll_interval``:
    seconds between reads of the running tasks' files; ``kill_grace``: seconds between TERM
    and KILL on interruption."""

    def __init__(self, base: str | None = None, *, poll_interval: float = 0.02,
                 kill_grace: float = 10.0,
                 run_status_interval: float = DEFAULT_RUN_STATUS_INTERVAL) -> None:
        self.base = base or default_local_base()
        self.poll_interval = poll_interval
        self.kill_grace = kill_grace
        self.run_status_interval = run_status_interval

    def run(self, context: OpExecutionContext, request: JobRequest, keys: Sequence[str],
            parallelism: int | None, retries: int = 0) -> ArrayInvocation:
        """Run ``request`` once per key of ``keys``, at most ``parallelism`` at once (None:
        as many as this machine has CPUs), the failed keys again up to ``retries`` times;
        raises :class:`~dagster_slurm.jobs.array_tasks.SlurmArrayTasksFailed` when some
        still failed."""
        run_id, step_key = step_identity(context)
        paths = InvocationPaths.create(self.base, run_id, step_key)
        layout = ArrayLayout(paths.job_dir)
        tasks = layout.tasks(list(keys))
        script = self._write_files(context, request, paths, layout, tasks)
        limit = parallelism or os.cpu_count() or 1
        context.log.info(f"Running {len(tasks)} partitions as local processes, at most {limit} "
                         f"at once; files in {paths.job_dir}")
        progress = ArrayProgress(context, tasks)
        started = time.monotonic()
        self._run_pool(context, progress, tasks, script, paths.file("array-0.out"), limit)
        for attempt in range(1, retries + 1):
            failed = [tasks[p] for p in sorted(progress.failures)]
            if not failed:
                break
            context.log.warning(
                f"Retry {attempt} of {retries}: running the {len(failed)} failed partition(s) "
                f"again: {', '.join(repr(t.key) for t in failed)}")
            for task in failed:
                for path in (task.status, task.messages, task.stdout, task.stderr):
                    if os.path.exists(path):
                        os.remove(path)
            progress.retry([t.position for t in failed])
            self._run_pool(context, progress, failed, script, paths.file("array-0.out"), limit)
        progress.summary = {"dagster_slurm/mode": "local", "dagster_slurm/partitions": len(tasks),
                            "dagster_slurm/failed_partitions": len(progress.failures),
                            "dagster_slurm/elapsed_seconds": round(time.monotonic() - started, 3),
                            **run_summary(end.figures for end in progress.ends.values())}
        if not progress.failures and not request.defer_cleanup:
            shutil.rmtree(paths.job_dir, ignore_errors=True)
            for parent in (paths.step_dir, paths.run_dir):
                try:
                    os.rmdir(parent)
                except OSError:
                    break
        progress.raise_failures()
        return ArrayInvocation(tuple(progress.results()), progress.summary)

    def _write_files(self, context: OpExecutionContext, request: JobRequest,
                     paths: InvocationPaths, layout: ArrayLayout,
                     tasks: Sequence[PartitionTask]) -> str:
        os.makedirs(paths.job_dir, mode=0o700, exist_ok=True)
        payload = payload_argv(request.payload_path, job_dir=paths.job_dir, python=sys.executable)
        if payload.needs_upload:
            assert payload.upload_from is not None and payload.upload_name is not None
            shutil.copyfile(payload.upload_from, paths.upload_target(payload.upload_name))
        step_data = step_context_data(context, request.extras)
        for task in tasks:
            os.makedirs(task.dir, mode=0o700, exist_ok=True)
            data = partition_context_data(step_data, context, task.key)
            _write_private(task.context, json.dumps(data))
        _write_private(layout.tasks_file(0), tasks_file_content(tasks))
        plan = ExecutionPlan(
            payload=payload.argv, job_dir=paths.job_dir, status_file=paths.status,
            drain_file=paths.drain, mode="local", pid_file=paths.pid,
            env={**current_environment_path(), **request.extra_env},
            array_tasks_file=layout.tasks_file(0),
        )
        script = layout.script(0)
        _write_private(script, request.launcher.render(plan))
        return script

    def _run_pool(self, context: OpExecutionContext, progress: ArrayProgress,
                  tasks: Sequence[PartitionTask], script: str, early_output: str,
                  limit: int) -> None:
        waiting = deque(tasks)
        running: dict[int, _Running] = {}
        begun = time.monotonic()
        follower = follower_for(context, self.run_status_interval)
        try:
            with open(early_output, "ab") as out:
                while waiting or running:
                    while waiting and len(running) < limit:
                        task = waiting.popleft()
                        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task.position)}
                        proc = subprocess.Popen(
                            ["bash", script], stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                            cwd=task.dir, env=env, start_new_session=True)
                        now = time.monotonic()
                        running[task.position] = _Running(task, proc, now, now - begun)
                    for position, item in list(running.items()):
                        self._read(progress, item.task)
                        pid, status, usage = os.wait4(item.proc.pid, os.WNOHANG)
                        if not pid:
                            continue
                        del running[position]
                        item.proc.returncode = os.waitstatus_to_exitcode(status)
                        self._finish(progress, item, status, usage)
                    follower.check(f"{len(running)} local partition processes")
                    if running:
                        time.sleep(self.poll_interval)
        except BaseException:
            terminate_groups([(item.proc, f"{item.task.dir}/payload.pgid")
                              for item in running.values()], self.kill_grace)
            raise

    def _read(self, progress: ArrayProgress, task: PartitionTask, *, final: bool = False) -> None:
        tailed = progress.messages_of(task.position)
        while True:
            chunk = read_local_chunk(TailRequest(task.messages, tailed.offset))
            tailed.offset = chunk.offset
            if chunk.data or (final and chunk.eof):
                progress.feed(task.position, chunk.data, final=final and chunk.eof)
            if chunk.eof:
                return

    def _finish(self, progress: ArrayProgress, item: _Running, status: int, usage: object) -> None:
        self._read(progress, item.task, final=True)
        recorded = _recorded_status(item.task)
        code = recorded if recorded is not None else os.waitstatus_to_exitcode(status)
        if code < 0:
            code = 128 - code
        elapsed = time.monotonic() - item.started
        cpu = usage.ru_utime + usage.ru_stime  # type: ignore[attr-defined]
        metrics = replace(from_local(f"local-{item.proc.pid}", code, elapsed, cpu,
                                     usage.ru_maxrss),  # type: ignore[attr-defined]
                          queue_wait_seconds=item.waited)  # the wait for a place in the pool
        figures = metrics.as_metadata()
        end = TaskEnd(metrics.job_id, "COMPLETED" if code == 0 else "FAILED", code, figures)
        progress.finish(item.task.position, end, stdout_tail=_tail(item.task.stdout),
                        stderr_tail=_tail(item.task.stderr))


def _recorded_status(task: PartitionTask) -> int | None:
    """The exit status the job script wrote for the task (None: none, or unreadable)."""
    try:
        with open(task.status) as handle:
            return parse_exit_code(handle.read())
    except OSError:
        return None


def _tail(path: str) -> str:
    """The last :data:`TAIL_BYTES` of ``path`` as text (empty when it cannot be read)."""
    return read_local_chunk(TailRequest(path, -TAIL_BYTES, TAIL_BYTES)).data.decode(
        "utf-8", "replace")


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
