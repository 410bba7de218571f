"""Which activation script a Slurm payload sources: a pre-deployed environment or a packed one."""

from __future__ import annotations

from typing import Any


def activation_for(compute: Any, context: Any) -> str | None:
    """The activation script on the cluster for ``compute``'s environment settings.

    Delegates to :func:`dagster_slurm.environment.prepare_environment`: with
    ``pre_deployed_env_path`` its ``activate.sh`` or ``bin/activate`` (a clear error when
    neither exists); otherwise the current environment (or ``env_packages``) packed and
    deployed under the deployment base path, cached by content hash.
    """
    from dagster_slurm.environment import EnvironmentConfig, prepare_environment

    slurm = compute.slurm
    config = EnvironmentConfig(
        pre_deployed_env_path=compute.pre_deployed_env_path,
        auto_detect_platform=compute.auto_detect_platform,
        env_packages=compute.env_packages,
    )
    handle = prepare_environment(slurm.agent(), slurm.base_path(), config, logger=context.log)
    return handle.activation_script
