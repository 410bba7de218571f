"""Which activation script a Slurm payload sources: a pre-deployed environment or a packed one.

Shared by asset scope (``ComputeResource``) and run scope (the run session), so it lives
below both."""

from __future__ import annotations

from typing import Any


def activation_for(owner: Any, context: Any) -> str | None:
    """The activation script on the cluster for ``owner``'s environment settings (a resource
    with ``slurm``, ``pre_deployed_env_path``, ``auto_detect_platform`` and ``env_packages``;
    ``context.log`` gets the progress lines).

    Delegates to :func:`dagster_slurm.environment.prepare_environment`: with
    ``pre_deployed_env_path`` its ``activate.sh`` or ``bin/activate`` (a clear error when
    neither exists); otherwise the current environment (or ``env_packages``) packed and
    deployed under the deployment base path, cached by content hash.
    """
    from dagster_slurm.environment import EnvironmentConfig, prepare_environment

    slurm = owner.slurm
    config = EnvironmentConfig(
        pre_deployed_env_path=owner.pre_deployed_env_path,
        auto_detect_platform=owner.auto_detect_platform,
        env_packages=owner.env_packages,
    )
    handle = prepare_environment(slurm.agent(), slurm.base_path(), config, logger=context.log)
    return handle.activation_script
