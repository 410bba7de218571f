"""``LocalPipesClient`` and ``SlurmPipesClient``: the published package's client names.

The published dagster-slurm package exported its two Pipes clients for direct use. Here
both are :class:`~dagster_slurm.compute.pipes_client.ComputePipesClient`\\ s over a
``ComputeResource`` they build from their arguments, so ``client.run(context=...,
payload_path=..., extra_env=..., extras=...)`` behaves as ``compute.run`` does in local
mode or in slurm mode with ``allocation_scope='asset'``. An argument with no equivalent
here fails at construction with a :class:`~dagster_slurm.errors.ConfigurationError`
naming what to use instead; one that asks for what is the behaviour here anyway is
accepted.

Prefer a ``ComputeResource`` in the ``Definitions`` (or ``compute.get_pipes_client()``):
Dagster then opens and closes the cluster connection once per run. A ``SlurmPipesClient``
opens it for each call and closes it afterwards unless another user of the same
connection is still active.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import PipesClientCompletedInvocation

from dagster_slurm.compute.pipes_client import ComputePipesClient
from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.resources.slurm import SlurmResource

_PACKING = ("environments are packed and deployed by the library (see the ComputeResource "
            "fields env_packages, auto_detect_platform and pre_deployed_env_path)")


class LocalPipesClient(ComputePipesClient):
    """Runs payloads as local subprocesses: ``ComputeResource(mode='local',
    default_launcher=launcher, local_base_path=base_dir)``. ``base_dir``: the directory of
    the invocations' files (None: a per-user temporary directory). ``require_pixi`` is
    accepted and has no effect: the payload runs in the Python environment that runs
    Dagster, no pixi environment is needed."""

    def __init__(self, launcher: ComputeLauncher, base_dir: str | None = None,
                 require_pixi: bool = True) -> None:
        compute = ComputeResource(mode="local", default_launcher=launcher,
                                  local_base_path=base_dir)
        super().__init__(compute)


class SlurmPipesClient(ComputePipesClient):
    """Runs each payload as its own Slurm job: ``ComputeResource(mode='slurm',
    slurm=slurm_resource, default_launcher=launcher, ...)``.

    ``pre_deployed_env_path`` and ``auto_detect_platform`` are the resource's fields of the
    same names. ``debug_mode=True`` keeps every call's files (``defer_cleanup=True``); a
    failed job's files are always kept, so ``cleanup_on_failure`` has no effect.
    ``session_resource`` (a shared allocation) and the packing options
    (``pack_platform``, ``cache_inject_globs``, ``pack_on_remote``, ``remote_pack_timeout``)
    set to anything but their defaults are refused, naming the replacement.
    """

    def __init__(
        self,
        slurm_resource: SlurmResource,
        launcher: ComputeLauncher,
        session_resource: object | None = None,
        cleanup_on_failure: bool = True,
        debug_mode: bool = False,
        auto_detect_platform: bool = True,
        pack_platform: str | None = None,
        pre_deployed_env_path: str | None = None,
        cache_inject_globs: Sequence[str] | None = None,
        pack_on_remote: bool = False,
        remote_pack_timeout: int = 600,
    ) -> None:
        if session_resource is not None:
            raise ConfigurationError(
                "session_resource", type(session_resource).__name__,
                "a client outside the Definitions cannot release a run's shared allocation "
                "when the run ends; use ComputeResource(mode='slurm', allocation_scope='run', "
                "run_allocation=SlurmRunAllocationConfig(...)) as the asset's resource",
            )
        refused = {"pack_platform": pack_platform, "cache_inject_globs": cache_inject_globs,
                   "pack_on_remote": pack_on_remote or None,
                   "remote_pack_timeout": None if remote_pack_timeout == 600 else remote_pack_timeout}
        for name, value in refused.items():
            if value:
                raise ConfigurationError(name, value, "not supported here: " + _PACKING)
        self.slurm = slurm_resource
        compute = ComputeResource(
            mode="slurm", slurm=slurm_resource, default_launcher=launcher,
            pre_deployed_env_path=pre_deployed_env_path,
            auto_detect_platform=auto_detect_platform,
        )
        super().__init__(compute, defer_cleanup=debug_mode)

    def run(  # type: ignore[override]  # Dagster's PipesClient.run is meant to be extended
        self, *, context: Any, payload_path: str, **arguments: Any,
    ) -> PipesClientCompletedInvocation:
        """:meth:`ComputePipesClient.run`, holding the cluster connection for the call."""
        self.slurm.acquire()
        try:
            return super().run(context=context, payload_path=payload_path, **arguments)
        finally:
            self.slurm.release()
