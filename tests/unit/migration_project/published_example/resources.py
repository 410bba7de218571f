"""Resources for each value of ``DAGSTER_DEPLOYMENT``, organised as the published example
organises them: one base settings dictionary per kind of cluster (a Docker test cluster, an
HPC site), production overrides merged on top, and two builders that turn the settings into
a Slurm resource and one ComputeResource per launcher.

``development`` runs locally. Every other deployment builds Slurm resources without
connecting: the connection opens when a step first needs it. As in the published example,
``SlurmResource`` gets ``remote_base="$HOME/dagster_runs"`` unless ``SLURM_REMOTE_BASE`` is
set, and each ``ComputeResource`` gets ``session=None``. Lines changed from the published
example are marked ``Migration:`` with the reason given in docs/migration.md.
"""

import copy
import os
from enum import Enum
from typing import Any

import dagster as dg

from dagster_slurm import (
    BashLauncher,
    ComputeResource,
    RayLauncher,
    SlurmAllocationScope,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
    SSHConnectionResource,
)


# Migration: the published package shipped its ExecutionMode and Environment enums in
# dagster_slurm.config.environment; a project defines its deployments itself, and a mode is
# the string "local" or "slurm" (a member of a string enum, as here, is read by its value).
class Deployment(str, Enum):
    """Where this project runs."""

    DEVELOPMENT = "development"
    STAGING_DOCKER = "staging_docker"
    STAGING_DOCKER_SESSION = "staging_docker_session"
    PRODUCTION_DOCKER = "production_docker"
    STAGING_HPC = "staging_hpc"
    PRODUCTION_HPC = "production_hpc"


class Mode(str, Enum):
    """Where payloads run."""

    LOCAL = "local"
    SLURM = "slurm"


LOCAL_SETTINGS: dict[str, Any] = {
    "launchers": {"bash": {}, "ray": {"num_gpus_per_node": 0, "dashboard_port": 8265}},
}

DOCKER_CLUSTER: dict[str, Any] = {
    "ssh": {
        "host": "localhost",
        "port": 2223,
        "user": dg.EnvVar("SLURM_EDGE_NODE_USER"),
        "password": dg.EnvVar("SLURM_EDGE_NODE_PASSWORD"),
        "host_key_checking": "off",
    },
    "queue": {"num_nodes": 1, "time_limit": "00:20:00", "cpus": 2, "gpus_per_node": 0,
              "mem": "2048M"},
    "session": {"num_nodes": 2, "time_limit": "01:00:00"},
    # Migration: pack_on_remote, remote_pack_timeout, debug_mode and cache_inject_globs are
    # gone: environments are packed here and named by their content, and a failed job
    # keeps its files.
    "compute": {"auto_detect_platform": True},
    "launchers": {"bash": {},
                  "ray": {"num_gpus_per_node": 0, "dashboard_port": 8265,
                          "head_startup_timeout": 90}},
}

DOCKER_PRODUCTION: dict[str, Any] = {"queue": {"time_limit": "02:00:00", "mem": "4G"}}

HPC_SITE: dict[str, Any] = {
    "ssh": {
        "host": os.environ.get("SLURM_EDGE_NODE_HOST", "hpc-login.example.org"),
        "port": int(os.environ.get("SLURM_EDGE_NODE_PORT", "22")),
        "user": os.environ.get("SLURM_EDGE_NODE_USER", "researcher"),
        "password": os.environ.get("SLURM_EDGE_NODE_PASSWORD"),
        "key_path": os.environ.get("SLURM_EDGE_NODE_KEY_PATH"),
        "host_key_checking": os.environ.get("SLURM_EDGE_NODE_HOST_KEY_CHECKING") or "strict",
        "known_hosts_file": os.environ.get("SLURM_EDGE_NODE_KNOWN_HOSTS_FILE") or None,
    },
    "queue": {"partition": "compute", "num_nodes": 1, "time_limit": "02:00:00", "cpus": 8,
              "gpus_per_node": 0, "mem": "16G"},
    "session": {"num_nodes": 2, "time_limit": "06:00:00", "partition": "compute"},
    # Migration: pack_platform="linux-64" is gone: the environment is packed for the
    # platform found on the cluster (auto_detect_platform=True).
    "compute": {"auto_detect_platform": True},
    "launchers": {"bash": {}, "ray": {"num_gpus_per_node": 0, "head_startup_timeout": 150}},
}


def merge_into(target: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``target`` with ``changes`` merged in (nested dictionaries key by key, in place)."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_into(target[key], value)
        else:
            target[key] = value
    return target


def slurm_resources_from(settings: dict[str, Any]) -> dict[str, Any]:
    """The Slurm resource, and the session the published example passes on (None here)."""
    slurm = SlurmResource(
        ssh=SSHConnectionResource(**settings["ssh"]),
        queue=SlurmQueueConfig(**settings["queue"]),
        remote_base=os.getenv("SLURM_REMOTE_BASE", "$HOME/dagster_runs"),
    )
    return {"slurm": slurm, "session": None}


def compute_resources_from(settings: dict[str, Any],
                           slurm_resources: dict[str, Any]) -> dict[str, ComputeResource]:
    """``compute`` (Bash) and ``compute_ray`` (Ray); only the Ray one keeps a run scope."""
    launchers = {"compute": ("bash", BashLauncher), "compute_ray": ("ray", RayLauncher)}
    resources = {}
    for key, (name, launcher_class) in launchers.items():
        compute_settings = dict(settings["compute"])
        if name != "ray" and compute_settings.get("allocation_scope") == SlurmAllocationScope.RUN:
            del compute_settings["allocation_scope"]
            compute_settings.pop("run_allocation", None)
        resources[key] = ComputeResource(
            mode=Mode.SLURM,
            default_launcher=launcher_class(**settings["launchers"][name]),
            **slurm_resources,
            **compute_settings,
        )
    return resources


def deployment_from_env() -> Deployment:
    """``DAGSTER_DEPLOYMENT`` as a :class:`Deployment` (``development`` when unset)."""
    name = os.environ.get("DAGSTER_DEPLOYMENT", "development").strip().lower()
    try:
        return Deployment(name)
    except ValueError:
        known = ", ".join(member.value for member in Deployment)
        raise ValueError(f"DAGSTER_DEPLOYMENT={name!r} is not one of: {known}") from None


def get_resources() -> dict[str, ComputeResource]:
    """The compute resources of the current deployment."""
    deployment = deployment_from_env()
    if deployment is Deployment.DEVELOPMENT:
        launchers = LOCAL_SETTINGS["launchers"]
        return {
            "compute": ComputeResource(mode=Mode.LOCAL,
                                       default_launcher=BashLauncher(**launchers["bash"])),
            "compute_ray": ComputeResource(mode=Mode.LOCAL,
                                           default_launcher=RayLauncher(**launchers["ray"])),
        }

    production = deployment.value.startswith("production_")
    settings = copy.deepcopy(DOCKER_CLUSTER if "docker" in deployment.value else HPC_SITE)
    if production and "docker" in deployment.value:
        merge_into(settings, DOCKER_PRODUCTION)
    if production:
        deployed = os.environ.get("CI_DEPLOYED_ENVIRONMENT_PATH")
        if not deployed:
            raise ValueError(f"{deployment.value} needs CI_DEPLOYED_ENVIRONMENT_PATH")
        settings["compute"]["pre_deployed_env_path"] = deployed
        # Migration: default_skip_payload_upload=True is gone: payload files are uploaded
        # with their jobs (a script already on the cluster runs as a command).
    if deployment.value.endswith("_session"):
        # Migration: mode="slurm-session" with a SlurmSessionResource is
        # allocation_scope="run" with the session's shape in run_allocation.
        settings["compute"]["allocation_scope"] = SlurmAllocationScope.RUN
        settings["compute"]["run_allocation"] = SlurmRunAllocationConfig(**settings["session"])
    return compute_resources_from(settings, slurm_resources_from(settings))
