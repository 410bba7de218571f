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

Layout: this package holds what the user sets (:mod:`.config`), the error (:mod:`.errors`),
what :func:`prepare_environment` takes and returns (:mod:`.handle`) and
:func:`prepare_environment` itself (:mod:`.deploy`), which joins two sub-packages:

* :mod:`.packing`: packing here (requirements, pip, the local wheel cache, the wheelhouse,
  pixi-pack, content hashes, choosing a packer);
* :mod:`.cluster`: the cluster's side (its platform and the probe program, the layout and
  install commands under ``<base>/envs``, the shared wheel store, one build and its lease).

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
    "PythonPlatform": "dagster_slurm.environment.cluster.platform",
    "probe_cluster": "dagster_slurm.environment.cluster.platform",
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
    from dagster_slurm.environment.cluster.platform import PythonPlatform, probe_cluster
    from dagster_slurm.environment.config import EnvironmentConfig
    from dagster_slurm.environment.deploy import clear_process_cache, prepare_environment
    from dagster_slurm.environment.errors import EnvironmentSetupError
    from dagster_slurm.environment.handle import DeployOptions, EnvironmentHandle, Timings


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_slurm.environment' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
