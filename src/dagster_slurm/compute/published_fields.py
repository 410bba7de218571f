"""``ComputeResource`` keywords of the published dagster-slurm 1.x package with no field here.

Each entry of :data:`WITHDRAWN_FIELDS` says what to write instead; giving one of these
keywords is a :class:`~dagster_slurm.config_errors.WithdrawnFieldError` that lists every
such keyword given with its advice. ``session=None`` asks for what this library does
anyway (no shared allocation) and is dropped with a deprecation warning.

:func:`published_mode` turns the published package's execution modes (``"slurm-session"``,
``"slurm-hetjob"``, and members of a string enum) into today's value or a
:class:`~dagster_slurm.errors.ConfigurationError` saying what to write.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from dagster_slurm.config_errors import WithdrawnField
from dagster_slurm.errors import ConfigurationError

_NO_CLUSTER_PACKING = (
    "environments are packed on this machine (a wheelhouse, or pixi-pack when pixi is "
    "installed here) and installed on the login node from the uploaded files; nothing is "
    "packed on the cluster"
)
_NAMED_ENVIRONMENTS = (
    "no setup command builds named environments on the cluster here; build the environment "
    "there yourself and set pre_deployed_env_path to its directory (per asset: asset "
    "metadata slurm_pre_deployed_env_path), or let the library pack one (env_packages)"
)
_SHARED_ALLOCATION = (
    "the steps of a run share one allocation (and one Ray cluster) with mode='slurm', "
    "allocation_scope='run' and run_allocation=SlurmRunAllocationConfig(...)"
)


def _session_instead(value: object) -> str:
    """What to write instead of ``session=<value>``: the run scope with the session's shape
    (its fields that differ from their defaults), when the value is a session resource."""
    shape: dict[str, Any] = {}
    allocation = getattr(value, "run_allocation", None)
    if allocation is not None and hasattr(allocation, "model_dump"):
        shape.update(allocation.model_dump(exclude_defaults=True))
    if getattr(value, "num_nodes", None) is not None:
        shape["num_nodes"] = value.num_nodes  # type: ignore[attr-defined]
    if isinstance(value, Mapping):
        shape.update({k: v for k, v in value.items() if k not in ("slurm", "launcher")})
    arguments = ", ".join(f"{key}={item!r}" for key, item in shape.items()) or "..."
    return (
        "a run's shared allocation is a scope of ComputeResource here: write mode='slurm', "
        f"allocation_scope='run', run_allocation=SlurmRunAllocationConfig({arguments}) and "
        "leave session out (a SlurmSessionResource is a resource of its own, for steps that "
        "run commands without Pipes)"
    )


#: Published ``ComputeResource`` keywords that are not fields here, with what to write.
WITHDRAWN_FIELDS: tuple[WithdrawnField, ...] = (
    WithdrawnField(
        "session", _session_instead, harmless=lambda value: value is None,
        harmless_note="None asks for no shared allocation, which is what "
        "allocation_scope='asset', the default, does",
    ),
    WithdrawnField("pack_on_remote", f"{_NO_CLUSTER_PACKING}; remove pack_on_remote (an "
                   "environment built on the cluster is used through pre_deployed_env_path)"),
    WithdrawnField("remote_pack_timeout", f"{_NO_CLUSTER_PACKING}; remove remote_pack_timeout"),
    WithdrawnField(
        "pack_platform",
        "the environment is packed for the Python platform detected on the cluster "
        "(auto_detect_platform=True, the default) or, with auto_detect_platform=False, for "
        "this machine's; remove pack_platform and keep auto_detect_platform=True",
    ),
    WithdrawnField(
        "cache_inject_globs",
        "a packed environment is named by a hash of its content, and a local project "
        "installed from a directory is rebuilt when its files change, so a change gives a "
        "new environment by itself; remove cache_inject_globs",
    ),
    WithdrawnField("project_setup_cmd", f"{_NAMED_ENVIRONMENTS}; remove project_setup_cmd"),
    WithdrawnField("project_setup_env", f"{_NAMED_ENVIRONMENTS}; remove project_setup_env"),
    WithdrawnField("project_setup_input_globs",
                   f"{_NAMED_ENVIRONMENTS}; remove project_setup_input_globs"),
    WithdrawnField("default_environment_name",
                   f"{_NAMED_ENVIRONMENTS}; remove default_environment_name"),
    WithdrawnField(
        "debug_mode",
        "a failed job keeps its files (its log names the directory) and a successful one "
        "removes them; to keep a successful call's files pass defer_cleanup=True to "
        "compute.run. Remove debug_mode",
    ),
    WithdrawnField(
        "cleanup_on_failure",
        "a failed job's files are always kept for debugging; remove cleanup_on_failure",
    ),
    WithdrawnField(
        "default_skip_payload_upload",
        "a payload_path that names a local file is uploaded with its job; to run a script "
        "that is already on the cluster, pass a command such as payload_path='python "
        "/path/on/cluster/script.py', or config=SlurmRunConfig(skip_payload_upload=True, "
        "remote_payload_path='/path/on/cluster/script.py'). Remove default_skip_payload_upload",
    ),
    WithdrawnField(
        "default_extra_files",
        "only the payload file is uploaded; put other files on the cluster's shared "
        "filesystem (or in the environment) and pass their paths through extra_env or "
        "extras. Remove default_extra_files",
    ),
    WithdrawnField("enable_cluster_reuse", f"{_SHARED_ALLOCATION}; remove enable_cluster_reuse"),
    WithdrawnField("cluster_reuse_tolerance",
                   f"{_SHARED_ALLOCATION}; remove cluster_reuse_tolerance"),
)

#: The published package's execution modes that are not modes here, with what to write.
PUBLISHED_MODES: Mapping[str, str] = {
    "slurm-session": (
        "the published package's shared-allocation mode is mode='slurm', "
        "allocation_scope='run' here, with the allocation's shape in "
        "run_allocation=SlurmRunAllocationConfig(...)"
    ),
    "slurm-hetjob": (
        "not a mode here: write mode='slurm' (every step submits a job of its own); "
        "compute.run_hetjob(context, components=[...], payload_path=...) runs one step as a "
        "heterogeneous job"
    ),
}


def published_mode(value: object) -> object:
    """``value`` as ``ComputeResource.mode`` reads it: a member of a string enum (the
    published ``ExecutionMode.LOCAL``) becomes its value; the published modes of
    :data:`PUBLISHED_MODES` raise :class:`ConfigurationError` saying what to write; any
    other value is returned unchanged (the field's own check refuses a wrong one)."""
    if isinstance(value, Enum) and isinstance(value.value, str):
        value = value.value
    if isinstance(value, str) and value in PUBLISHED_MODES:
        raise ConfigurationError("mode", value, PUBLISHED_MODES[value])
    return value
