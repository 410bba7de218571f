"""Reading a worker allocation's files in the dev-cluster tests (the session directory is
on this host's filesystem)."""

import logging
import uuid
from types import SimpleNamespace
from typing import Any

from compute_support import slurm_resource
from session_support import session_compute

from dagster_slurm import RayLauncher, SlurmRunAllocationConfig
from dagster_slurm.jobs.activation import activation_for
from dagster_slurm.session.session import RunSession
from dagster_slurm.session.workers.submit import parse_ray_nodes


def read_text(path: str) -> str:
    """The file's text; empty when it does not exist (yet)."""
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def ray_nodes(session: RunSession, job_id: str) -> dict[str, tuple[str, str]]:
    """Worker allocation ``job_id``'s joined nodes: host -> (Ray node id, head job id)."""
    return parse_ray_nodes(read_text(session.paths.ray_nodes(job_id)))


def ray_run_session(env: dict[str, str], log: logging.Logger) -> tuple[RunSession, Any]:
    """A Ray run session whose head is one ``cpu`` node (2 CPUs, 2500M, 10 minutes), on the
    dev cluster's Ray environment, and its SlurmResource (close both when done)."""
    compute = session_compute("ray", env)
    slurm = slurm_resource(env)
    activation = activation_for(compute, SimpleNamespace(log=log))
    config = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=2,
                                      mem="2500M", time_limit="00:10:00",
                                      heartbeat_timeout=300, heartbeat_interval=5)
    session = RunSession(slurm, str(uuid.uuid4()), config, RayLauncher(include_dashboard=False),
                         activation=lambda: activation)
    return session, slurm
