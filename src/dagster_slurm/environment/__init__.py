"""The Python environment the payload runs in on the cluster.

Either an environment that already exists there (``pre_deployed_env_path``), or one packed
here and installed on the login node: pixi-pack when pixi is installed here, else a
wheelhouse of the current environment (or of ``env_packages``) for the cluster's platform,
installed into a venv without internet access. Packed environments are cached on the
cluster by content hash, so a second run uploads nothing.

Usage::

    from dagster_slurm.environment import EnvironmentConfig, prepare_environment

    handle = prepare_environment(slurm.agent(), slurm.base_path(), EnvironmentConfig())
    handle.activation_script   # source this before running the payload

Modules: :mod:`.config` (user settings), :mod:`.platform` and :mod:`.remote_probe` (the
cluster's wheel tags), :mod:`.requirements` (which distributions), :mod:`.pip`,
:mod:`.pool` and :mod:`.wheelhouse` (wheels and their local cache), :mod:`.pixi`,
:mod:`.packing` (choosing a packer), :mod:`.hashing` (content hashes), :mod:`.remote` and
:mod:`.remote_wheels` (layout, commands and wheel store on the cluster), :mod:`.builder`
(one build), :mod:`.lease_store` (the build lease), :mod:`.handle` and :mod:`.deploy`
(:func:`prepare_environment`).

Names are imported lazily, so importing this package does not import Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "EnvironmentConfig": "dagster_slurm.environment.config",
    "EnvironmentHandle": "dagster_slurm.environment.handle",
    "DeployOptions": "dagster_slurm.environment.handle",
    "Timings": "dagster_slurm.environment.handle",
    "prepare_environment": "dagster_slurm.environment.deploy",
    "clear_process_cache": "dagster_slurm.environment.deploy",
    "EnvironmentSetupError": "dagster_slurm.environment.errors",
    "PythonPlatform": "dagster_slurm.environment.platform",
    "probe_cluster": "dagster_slurm.environment.platform",
}

__all__ = [
    "DeployOptions",
    "EnvironmentConfig",
    "EnvironmentHandle",
    "EnvironmentSetupError",
    "PythonPlatform",
    "Timings",
    "clear_process_cache",
    "prepare_environment",
    "probe_cluster",
]

if TYPE_CHECKING:
    from dagster_slurm.environment.config import EnvironmentConfig
    from dagster_slurm.environment.deploy import clear_process_cache, prepare_environment
    from dagster_slurm.environment.errors import EnvironmentSetupError
    from dagster_slurm.environment.handle import DeployOptions, EnvironmentHandle, Timings
    from dagster_slurm.environment.platform import PythonPlatform, probe_cluster


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_slurm.environment' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
