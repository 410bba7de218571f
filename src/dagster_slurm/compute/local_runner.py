"""One ``compute.run`` in local mode: the same launcher script, run as a local subprocess.

The launcher renders the same script as in Slurm mode (``mode="local"``); stdout and stderr
go to files in the invocation directory and are tailed, with the Pipes messages, by the same
reader as on a cluster, so an asset behaves the same on a laptop. Interruption ends the
payload's whole process group (TERM, then KILL after ``kill_grace`` seconds).

The step waits for the script's exit without polling it where the platform allows
(:class:`~dagster_slurm.compute.process_exit.ExitWatch`); the final read of the files starts
as soon as the script is gone and, the files being local, does not wait for a ``closed``
message that a payload killed mid-way never wrote.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dagster import OpExecutionContext, PipesClientCompletedInvocation

from dagster_slurm.compute.process_exit import ExitWatch
from dagster_slurm.jobs.contexts import step_identity
from dagster_slurm.jobs.errors import JobOutcome
from dagster_slurm.jobs.follow import DEFAULT_RUN_STATUS_INTERVAL, follower_for
from dagster_slurm.jobs.logs import notable_stdout_sink
from dagster_slurm.jobs.metrics import from_local
from dagster_slurm.jobs.outcome import outcome_error
from dagster_slurm.jobs.paths import InvocationPaths
from dagster_slurm.jobs.published_metadata import invocation_metadata
from dagster_slurm.jobs.runner import JobRequest, PipesJobRunner, PreparedJob
from dagster_slurm.launchers.base import ExecutionPlan, PayloadSpec, payload_argv
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.reader import PipesTailMessageReader
from dagster_slurm.pipes.sources import LocalFileSource
from dagster_slurm.slurm.states import JobState


def default_local_base() -> str:
    """``$DAGSTER_SLURM_LOCAL_BASE`` or ``<tmp>/dagster-slurm-<uid>``."""
    return os.environ.get("DAGSTER_SLURM_LOCAL_BASE") or os.path.join(
        tempfile.gettempdir(), f"dagster-slurm-{os.getuid()}"
    )


@dataclass
class LocalJob(PreparedJob):
    """One local invocation: its files (under the local base) and its payload."""

    paths: InvocationPaths
    payload: PayloadSpec


@dataclass(frozen=True)
class LocalProcess:
    """The started job script: the process and when it started (``time.monotonic``)."""

    proc: subprocess.Popen
    started: float


@dataclass(frozen=True)
class LocalExit:
    """How the job script ended: exit ``code`` (128+N for signal N), wall ``elapsed`` and
    ``cpu`` seconds, peak ``rss`` (KiB, as ``wait4`` reports it) and the process ``pid``."""

    code: int
    elapsed: float
    cpu: float
    rss: int
    pid: int


class LocalRunner(PipesJobRunner[LocalJob, LocalProcess, LocalExit]):
    """Runs one payload as a local subprocess through Dagster Pipes.

    ``base``: directory of the invocation files (None: :func:`default_local_base`);
    ``activation``: a script sourced before the payload (None: none); ``kill_grace``:
    seconds between TERM and KILL when the step is interrupted; ``poll_interval``: seconds
    between reads of the Pipes files; ``run_status_interval``: seconds between reads of the
    step's run status while waiting.
    """

    #: Longest pause between two reads of the local files (``pipes_poll_interval`` applies
    #: when shorter): a read of three local files costs tens of microseconds, so messages are
    #: read about as soon as Dagster's own subprocess client reads them.
    POLL_INTERVAL = 0.02
    #: First and longest pause between two checks whether the job script has exited, where
    #: its exit cannot be waited for (no pidfd); with one, the exit itself wakes the wait.
    EXIT_POLL_INITIAL = 0.02
    EXIT_POLL_MAXIMUM = 0.1

    def __init__(self, base: str | None = None, *, poll_interval: float = POLL_INTERVAL,
                 kill_grace: float = 10.0,
                 activation: str | None = None,
                 run_status_interval: float = DEFAULT_RUN_STATUS_INTERVAL) -> None:
        self.base = base or default_local_base()
        self.poll_interval = poll_interval
        self.run_status_interval = run_status_interval
        self.kill_grace = kill_grace
        self.activation = activation

    def _prepare(self, context: OpExecutionContext, request: JobRequest) -> LocalJob:
        run_id, step_key = step_identity(context)
        paths = InvocationPaths.create(self.base, run_id, step_key)
        os.makedirs(paths.job_dir, exist_ok=True)
        payload = payload_argv(request.payload_path, job_dir=paths.job_dir, python=sys.executable)
        if payload.needs_upload:
            assert payload.upload_from is not None and payload.upload_name is not None
            with open(payload.upload_from, "rb") as src, open(paths.upload_target(payload.upload_name), "wb") as dst:
                dst.write(src.read())
        # closed_grace=0: the files are local, so once the process has exited everything it
        # wrote is there; a payload that died without its closed message is not waited for
        reader = PipesTailMessageReader(
            LocalFileSource(), paths.messages, paths.stdout, paths.stderr,
            poll_interval=self.poll_interval, stdout_sink=notable_stdout_sink(context.log),
            closed_grace=0.0,
        )
        return LocalJob(context, request, PipesDeferredFileContextInjector(paths.context), reader,
                        paths, payload)

    def _start(self, job: LocalJob, pipes: Any) -> LocalProcess:
        paths = job.paths
        with open(paths.context, "wb") as handle:
            handle.write(job.injector.payload)
        plan = ExecutionPlan(
            payload=job.payload.argv, job_dir=paths.job_dir, status_file=paths.status,
            drain_file=paths.drain, mode="local", pid_file=paths.pid,
            env={**current_environment_path(), **pipes.get_bootstrap_env_vars(), **job.request.extra_env},
            activation=self.activation,
        )
        with open(paths.script, "w") as handle:
            handle.write(job.request.launcher.render(plan))
        started = time.monotonic()
        with open(paths.stdout, "wb") as out, open(paths.stderr, "wb") as err:
            proc = subprocess.Popen(
                ["bash", paths.script], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                cwd=paths.job_dir, start_new_session=True,
            )
        job.reader.wake()  # the files exist now: no idle wait as for a job in a queue
        job.context.log.info(f"Started local payload process {proc.pid} in {paths.job_dir}")
        return LocalProcess(proc, started)

    def _wait(self, job: LocalJob, handle: LocalProcess) -> LocalExit:
        """Block until the job script exits; woken by the exit itself (see
        :class:`~dagster_slurm.compute.process_exit.ExitWatch`), so the final read of the
        Pipes files starts as soon as the process is gone. The step's run is followed
        meanwhile, every ``run_status_interval`` seconds from the start (Dagster has just
        started the step in its running run; a payload that ends sooner costs no read of
        the run)."""
        proc = handle.proc
        follower = follower_for(job.context, self.run_status_interval)
        with ExitWatch(proc.pid, poll_initial=self.EXIT_POLL_INITIAL,
                       poll_maximum=self.EXIT_POLL_MAXIMUM) as watch:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() - handle.started >= self.run_status_interval:
                    follower.check(f"the local process {proc.pid}")  # as in Slurm mode
                watch.wait(self.run_status_interval)
        proc.returncode = os.waitstatus_to_exitcode(status)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return LocalExit(code, time.monotonic() - handle.started, usage.ru_utime + usage.ru_stime,
                         usage.ru_maxrss, proc.pid)

    def _terminate(self, job: LocalJob, handle: LocalProcess, error: BaseException) -> None:
        terminate_groups([(handle.proc, job.paths.pid)], self.kill_grace)

    def _outcome(self, job: LocalJob, handle: LocalProcess, result: LocalExit,
                 pipes: Any) -> PipesClientCompletedInvocation:
        paths, code = job.paths, result.code
        job_id = f"local-{result.pid}"
        state = JobState.COMPLETED if code == 0 else JobState.FAILED
        outcome = JobOutcome(job_id, state.value, code, job.reader.stdout_tail(), job.reader.stderr_tail())
        error = outcome_error(state, outcome)
        if not job.request.defer_cleanup and error is None:
            _remove_tree(paths.job_dir)
            for parent in (paths.step_dir, paths.run_dir):
                try:
                    os.rmdir(parent)
                except OSError:
                    break
        if error is not None:
            raise error
        metrics = from_local(job_id, code, result.elapsed, result.cpu, result.rss)
        return PipesClientCompletedInvocation(
            pipes, metadata=invocation_metadata(metrics, job.request.published_metrics))


def current_environment_path() -> dict[str, str]:
    """PATH with this interpreter's ``bin`` first: local payloads (and tools such as ``ray``)
    run in the Python environment Dagster runs in, activated or not."""
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return {"PATH": path if path.split(os.pathsep)[0] == bin_dir else f"{bin_dir}{os.pathsep}{path}"}


def terminate_groups(processes: Sequence[tuple[subprocess.Popen, str]], grace: float) -> None:
    """TERM the group of each job script (it forwards to its payload), wait up to ``grace``
    seconds for all of them together, then KILL each script's group and its payload's group
    (read from its pid file, when the payload started)."""
    for proc, _ in processes:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(proc.poll() is None for proc, _ in processes):
        time.sleep(0.05)
    for proc, pid_file in processes:
        groups = [proc.pid]
        try:
            with open(pid_file) as handle:
                groups.append(int(handle.read().strip()))
        except (OSError, ValueError):
            pass
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
