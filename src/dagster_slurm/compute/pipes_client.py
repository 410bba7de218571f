"""``ComputePipesClient``: a Dagster ``PipesClient`` over a ``ComputeResource``.

``ComputeResource.get_pipes_client(context, launcher=None)`` returns one, for code written
for the published dagster-slurm package (whose ``get_pipes_client`` returned its local or
Slurm Pipes client) and for code that expects Dagster's ``PipesClient`` interface
(``client.run(context=..., extras=..., ...)``). Its ``run`` is the resource's ``run`` with
the client's launcher: same modes, scope, checks, errors and metadata. The resource keeps
its lifecycle (Dagster sets it up and tears it down), so a client is cheap to make per call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dagster import PipesClient, PipesClientCompletedInvocation

from dagster_slurm.launchers.base import ComputeLauncher


class RunsPayloads(Protocol):
    """What the client needs of a ``ComputeResource``: its ``run``."""

    def run(self, context: Any, payload_path: str, launcher: ComputeLauncher | None = None,
            extra_env: Mapping[str, str] | None = None, extras: Mapping[str, Any] | None = None,
            extra_slurm_opts: Mapping[str, Any] | None = None, defer_cleanup: bool = False,
            **published: Any) -> PipesClientCompletedInvocation: ...


class ComputePipesClient(PipesClient):
    """Runs payloads through ``compute`` (a ``ComputeResource``) with ``launcher`` (None:
    the resource's ``default_launcher``). ``defer_cleanup`` is the default of the calls'
    ``defer_cleanup`` (True keeps every call's files, as the published clients'
    ``debug_mode=True`` did)."""

    def __init__(self, compute: RunsPayloads, launcher: ComputeLauncher | None = None, *,
                 defer_cleanup: bool = False) -> None:
        self.compute = compute
        self.launcher = launcher
        self.defer_cleanup = defer_cleanup

    def run(  # type: ignore[override]  # Dagster's PipesClient.run is meant to be extended
        self,
        *,
        context: Any,
        payload_path: str,
        extras: Mapping[str, Any] | None = None,
        extra_env: Mapping[str, str] | None = None,
        extra_slurm_opts: Mapping[str, Any] | None = None,
        defer_cleanup: bool | None = None,
        **published: Any,
    ) -> PipesClientCompletedInvocation:
        """``compute.run(context, payload_path, launcher=<the client's>, ...)``; the
        published keywords the resource's ``run`` accepts are accepted here too.
        ``defer_cleanup`` None takes the client's default."""
        keep = self.defer_cleanup if defer_cleanup is None else defer_cleanup
        return self.compute.run(
            context, payload_path, launcher=self.launcher, extra_env=extra_env, extras=extras,
            extra_slurm_opts=extra_slurm_opts, defer_cleanup=keep, **published,
        )
