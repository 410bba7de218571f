"""Which activation script a Slurm payload sources: a pre-deployed environment or a packed one."""

from __future__ import annotations

from typing import Any

from dagster_slurm.agent import exec_op
from dagster_slurm.errors import ConfigurationError


def activation_for(compute: Any, context: Any) -> str | None:
    """The activation script on the cluster for ``compute``'s environment settings.

    With ``pre_deployed_env_path``: its ``activate.sh``, else its ``bin/activate`` (checked in
    one round trip; a clear error when neither exists). Otherwise the current environment
    (or ``env_packages``) is packed and deployed, cached by content hash.
    """
    slurm = compute.slurm
    path = compute.pre_deployed_env_path
    if path is not None:
        candidates = [f"{path.rstrip('/')}/activate.sh", f"{path.rstrip('/')}/bin/activate"]
        probe = 'for f in "$@"; do [ -f "$f" ] && { printf "%s\\n" "$f"; exit 0; }; done; exit 1'
        result = slurm.agent().run(exec_op(["sh", "-c", probe, "sh", *candidates]))
        if result.rc != 0:
            raise ConfigurationError(
                "pre_deployed_env_path",
                path,
                f"neither {candidates[0]} nor {candidates[1]} exists on the cluster",
            )
        return result.stdout.strip()
    from dagster_slurm.environment.deploy import prepare_environment

    handle = prepare_environment(
        slurm,
        packages=compute.env_packages,
        auto_detect_platform=compute.auto_detect_platform,
        log=context.log,
    )
    return handle.activation_script
