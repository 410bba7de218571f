"""The allocation scope of a step, and the checks of its scheduler overrides against the
resource's queue and scope."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol

from dagster import OpExecutionContext

from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.session import RunSession


class ScopeSettings(Protocol):
    """What :func:`check_scope` reads of a ``ComputeResource``."""

    mode: str
    allocation_scope: Any
    slurm: Any
    run_allocation: SlurmRunAllocationConfig | None

    def get_run_allocation_session(self, context: Any, *, start: bool = True) -> RunSession: ...

__all__ = ["SlurmAllocationScope", "check_scope"]


class SlurmAllocationScope(str, Enum):
    """Which Slurm allocation a step runs in: its own (``ASSET``) or the run's (``RUN``)."""

    ASSET = "asset"
    RUN = "run"


def check_scope(resource: ScopeSettings, context: OpExecutionContext,
                launcher: ComputeLauncher, overrides: Mapping[str, Any],
                extra_slurm_opts: Mapping[str, Any] | None) -> RunSession | None:
    """Check the per-step scheduler overrides against the queue (and, in run scope,
    against the run allocation's shape); the same checks in local mode, so an asset
    that passes locally submits. Returns the run's session in slurm mode with run scope
    (created, not started), else None."""
    run_scope = resource.allocation_scope.value == "run"
    if resource.mode == "slurm" and run_scope:
        from dagster_slurm.session.frontend.runner import check_step

        session = resource.get_run_allocation_session(context, start=False)
        check_step(session, launcher, overrides, extra_slurm_opts)
        return session
    if resource.mode == "slurm":
        return None  # SlurmRunner builds (and so checks) the job's sbatch spec first
    from dagster_slurm.slurm.queue import SlurmQueueConfig

    queue = resource.slurm.queue if resource.slurm is not None else SlurmQueueConfig()
    queue.to_sbatch_spec("local-check", "/dev/null", **overrides)
    if run_scope:
        from dagster_slurm.session.core.config import check_shape

        check_shape(resource.run_allocation or SlurmRunAllocationConfig(), queue, overrides,
                    extra_slurm_opts)
    return None
