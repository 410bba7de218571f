"""The files of one invocation on the cluster: what is written before it starts, how its
output is read (Pipes messages, stdout, stderr) and how it is removed afterwards.

Shared by the asset-scope runner (one job per invocation) and the run-scope runner (one
step of the run's allocation per invocation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dagster_slurm.agent import exec_op, remove_op
from dagster_slurm.agent.client import Batch
from dagster_slurm.jobs.logs import notable_stdout_sink
from dagster_slurm.jobs.paths import InvocationPaths
from dagster_slurm.launchers.base import PayloadSpec
from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.reader import PipesTailMessageReader
from dagster_slurm.pipes.sources import AgentFileSource, FileSource, WatchingFileSource


def tail_reader(agent: Any, paths: InvocationPaths, context: Any, poll_interval: float,
                on_status: Callable[[], None] | None = None) -> PipesTailMessageReader:
    """The Pipes reader of an invocation on the cluster: messages, stdout and stderr read in
    one round trip per poll; stdout also feeds :func:`~dagster_slurm.jobs.logs.notable_stdout_sink`
    (notable lines go to ``context.log``). With ``on_status``, every poll also looks for the
    invocation's exit-status file (same round trip) and calls it once when it appears."""
    source: FileSource = AgentFileSource(agent)
    if on_status is not None:
        source = WatchingFileSource(source, paths.status, on_status)
    return PipesTailMessageReader(
        source, paths.messages, paths.stdout, paths.stderr,
        poll_interval=poll_interval, stdout_sink=notable_stdout_sink(context.log),
    )


def invocation_files(paths: InvocationPaths, payload: PayloadSpec,
                     injector: PipesDeferredFileContextInjector) -> dict[str, tuple[str | bytes, int]]:
    """Files an invocation writes before it starts (path -> (content, mode)): the Pipes
    context and, for a local script, the uploaded payload."""
    files: dict[str, tuple[str | bytes, int]] = {paths.context: (injector.payload, 0o600)}
    if payload.needs_upload:
        assert payload.upload_from is not None and payload.upload_name is not None
        with open(payload.upload_from, "rb") as handle:
            files[paths.upload_target(payload.upload_name)] = (handle.read(), 0o600)
    return files


def remove_invocation(batch: Batch, paths: InvocationPaths, *parents: str,
                      requires: Sequence[Any] = ()) -> None:
    """Add to ``batch`` the removal of the invocation's directory (only once the operations
    of ``requires`` succeeded), then of its step directory and ``parents`` where they are
    left empty."""
    removed = batch.add(remove_op(paths.job_dir, root=paths.base), requires=list(requires))
    batch.add(exec_op(["rmdir", "--ignore-fail-on-non-empty", paths.step_dir, *parents]),
              requires=[removed])
