"""Removal of the files a step kept with ``compute.run(..., defer_cleanup=True)``."""

from __future__ import annotations

import shutil
from typing import Any

from dagster_slurm.jobs.contexts import ExecutionContext, step_identity
from dagster_slurm.jobs.paths import InvocationPaths


def remove_deferred_files(resource: Any, context: ExecutionContext) -> None:
    """Remove the invocation files of ``context``'s step for ``resource`` (a
    ``ComputeResource``): in every allocation of the run (run scope, submitting nothing),
    under the local base (local mode) or the step's directory on the cluster (asset scope,
    one round trip)."""
    run_id, step_key = step_identity(context)
    if resource.mode == "slurm" and resource.allocation_scope == "run":
        resource.get_run_allocation_session(context, start=False).cleanup_step(step_key)
        return
    if resource.mode == "local":
        from dagster_slurm.compute.local_runner import default_local_base

        base = resource.local_base_path or default_local_base()
        shutil.rmtree(InvocationPaths.create(base, run_id, step_key).step_dir, ignore_errors=True)
        return
    from dagster_slurm.agent import remove_op

    assert resource.slurm is not None
    paths = InvocationPaths.create(resource.slurm.base_path(), run_id, step_key)
    resource.slurm.agent().run(remove_op(paths.step_dir, root=paths.base))
