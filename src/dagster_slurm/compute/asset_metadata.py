"""Asset metadata keys of the published dagster-slurm 1.x package that steered a step.

The published package read some keys of an asset's definition metadata
(``@dg.asset(metadata={...})``) in ``compute.run``. Here:

* ``slurm_pre_deployed_env_path`` is honoured: the step's payload runs in that environment
  on the cluster (a directory with ``activate.sh`` or ``bin/activate``), as with
  ``ComputeResource(pre_deployed_env_path=...)`` for this asset alone, in place of the
  resource's environment settings. With ``allocation_scope='run'`` every step runs in the run
  allocation's environment, so the key must then name the resource's own
  ``pre_deployed_env_path``.
* the other keys of :data:`REFUSED_KEYS` are refused, naming the key, the value and what to
  use instead.

Keys are read from every asset the step materializes (each selected asset of a
multi-asset); two assets of one step naming different environments is an error. A step
without assets (an op, an asset check) has no such metadata. Everything is checked in both
modes before anything is started or submitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import MetadataValue

from dagster_slurm.environment.config import validate_remote_dir
from dagster_slurm.errors import ConfigurationError

#: The key naming an asset's own pre-deployed environment (honoured).
ENV_PATH_KEY = "slurm_pre_deployed_env_path"

_NAMED = (
    "give the asset the directory of an environment that exists on the cluster as "
    f"metadata {ENV_PATH_KEY!r}, or give it a ComputeResource of its own with "
    "pre_deployed_env_path or env_packages"
)

#: Keys the published package read that have no equivalent here, with what to use instead.
REFUSED_KEYS: Mapping[str, str] = {
    "slurm_pack_cmd": (
        "environments are packed by this library (a wheelhouse of the current environment "
        f"or of env_packages, or pixi-pack), not by a command of yours; {_NAMED}"
    ),
    "slurm_environment_name": f"no setup command builds named environments here; {_NAMED}",
    "force_slurm_env_push": (
        "a packed environment is named by a hash of its content, so a changed dependency is "
        "built and uploaded anyway; remove the key"
    ),
    "skip_slurm_payload_upload": (
        "to run a script that is already on the cluster, pass a command such as "
        "payload_path='python /path/on/cluster/script.py' to compute.run, or "
        "config=SlurmRunConfig(skip_payload_upload=True, remote_payload_path=...)"
    ),
    "slurm_payload_path": (
        "pass the script as a command, payload_path='python /path/on/cluster/script.py', to "
        "compute.run, or config=SlurmRunConfig(skip_payload_upload=True, "
        "remote_payload_path=...)"
    ),
    "slurm_extra_files": (
        "only the payload file is uploaded; put the files on the cluster's shared filesystem "
        "(or in the environment) and pass their paths through extra_env or extras"
    ),
}


def step_asset_metadata(context: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """``(asset key as text, definition metadata)`` of each asset ``context``'s step
    materializes; ``[]`` for a context without assets (an op, an asset check, a stand-in
    context of a test)."""
    has_assets = getattr(context, "has_assets_def", False)
    if callable(has_assets):
        has_assets = has_assets()
    if has_assets is not True:
        return []
    by_key = getattr(context.assets_def, "metadata_by_key", None) or {}
    keys = getattr(context, "selected_asset_keys", None) or by_key.keys()
    found = []
    for key in sorted(keys, key=str):
        metadata = by_key.get(key)
        if isinstance(metadata, Mapping):
            label = key.to_user_string() if hasattr(key, "to_user_string") else str(key)
            found.append((label, metadata))
    return found


def _plain(value: Any) -> Any:
    """A metadata value as written: the ``value`` of a Dagster ``MetadataValue``."""
    return value.value if isinstance(value, MetadataValue) else value


def asset_environment(context: Any) -> str | None:
    """The ``slurm_pre_deployed_env_path`` of the step's assets (see the module docstring);
    None when none of them sets it. Raises :class:`ConfigurationError` for a key of
    :data:`REFUSED_KEYS`, a path that is not absolute, or assets of one step naming
    different paths."""
    paths: dict[str, str] = {}
    for asset, metadata in step_asset_metadata(context):
        for key in sorted(REFUSED_KEYS):
            if key in metadata:
                raise ConfigurationError(
                    f"metadata[{key!r}]", _plain(metadata[key]),
                    f"asset metadata of {asset} that this library does not read; "
                    f"{REFUSED_KEYS[key]}",
                )
        if ENV_PATH_KEY in metadata:
            value = _plain(metadata[ENV_PATH_KEY])
            field = f"metadata[{ENV_PATH_KEY!r}] of {asset}"
            if not isinstance(value, str):
                raise ConfigurationError(field, value, "must be a string, an absolute path on the cluster")
            checked = validate_remote_dir(field, value)
            assert checked is not None
            paths[asset] = checked
    if len(set(paths.values())) > 1:
        raise ConfigurationError(
            f"metadata[{ENV_PATH_KEY!r}]", paths,
            "the assets of one step name different environments; a step runs in one "
            "environment, so give them the same path or split them into separate assets",
        )
    return next(iter(paths.values()), None)


def check_run_scope_environment(asset_path: str | None, resource_path: str | None) -> None:
    """Refuse an asset environment a run-scope step cannot use: every step of a run
    allocation runs in the allocation's environment (``resource_path``, the resource's
    ``pre_deployed_env_path``; None: a packed one)."""
    if asset_path is None or asset_path == resource_path:
        return
    raise ConfigurationError(
        f"metadata[{ENV_PATH_KEY!r}]", asset_path,
        "with allocation_scope='run' every step runs in the run allocation's environment "
        f"(pre_deployed_env_path={resource_path!r} of the compute resource); give the asset "
        "a ComputeResource with allocation_scope='asset' for an environment of its own, or "
        "set the same pre_deployed_env_path on the run-scope resource",
    )


def step_environment(context: Any, *, run_scope: bool, resource_path: str | None) -> str | None:
    """The step's own pre-deployed environment from its assets' metadata
    (:func:`asset_environment`; None: the resource's settings apply), refused in run scope
    when it is not the resource's ``resource_path`` (:func:`check_run_scope_environment`)."""
    path = asset_environment(context)
    if run_scope:
        check_run_scope_environment(path, resource_path)
    return path
