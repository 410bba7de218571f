"""Which activation script a Slurm payload sources: a pre-deployed environment or a packed one.

Shared by asset scope (``ComputeResource``) and run scope (the run session), so it lives
below both."""

from __future__ import annotations

from typing import Any


def activation_for(owner: Any, context: Any, *, pre_deployed_env_path: str | None = None) -> str | None:
    """The activation script on the cluster for ``owner``'s environment settings (a resource
    with ``slurm``, ``pre_deployed_env_path``, ``auto_detect_platform`` and ``env_packages``;
    ``context.log`` gets the progress lines). ``pre_deployed_env_path``: a step's own
    pre-deployed environment, used in place of ``owner``'s settings (None: ``owner``'s).

    Delegates to :func:`dagster_slurm.environment.prepare_environment`: with a
    pre-deployed environment its ``activate.sh`` or ``bin/activate`` (a clear error when
    neither exists); otherwise the current environment (or ``env_packages``) packed and
    deployed under the deployment base path, cached by content hash.
    """
    from dagster_slurm.environment import EnvironmentConfig, prepare_environment

    slurm = owner.slurm
    if pre_deployed_env_path is not None:
        config = EnvironmentConfig(
            pre_deployed_env_path=pre_deployed_env_path,
            auto_detect_platform=owner.auto_detect_platform,
        )
    else:
        config = EnvironmentConfig(
            pre_deployed_env_path=owner.pre_deployed_env_path,
            auto_detect_platform=owner.auto_detect_platform,
            env_packages=owner.env_packages,
        )
    handle = prepare_environment(slurm.agent(), slurm.base_path(), config, logger=context.log)
    return handle.activation_script
