"""The sessions and worker allocations of the scaling-hook tests (``test_reconcile_workers``),
shared with the scripts those tests run in processes of their own (no tests here)."""

import uuid

from compute_support import slurm_resource

from dagster_slurm import (
    RayLauncher,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
)
from dagster_slurm.session.session import RunSession

#: A worker allocation that waits in the queue for an hour (``--begin=now+1hour``).
QUEUED = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1,
                                     gpus_per_node=0, mem="200M", time_limit="00:05:00",
                                     extra_sbatch_directives=["--begin=now+1hour"])
#: A worker allocation on one GPU node, which runs at once (and waits for a head).
GPU = SlurmWorkerAllocationConfig(partition="gpu", num_nodes=1, cpus_per_task=1,
                                  gpus_per_node=1, mem="200M", time_limit="00:05:00")


def headless_session(env: dict[str, str], run_id: str | None = None,
                     python: str | None = None) -> RunSession:
    """A Ray run session (``run_id``; None: a new one) whose head is never started
    (reconcile needs none); no environment is deployed (the workers wait for a head, or in
    the queue). ``python``: the login node's interpreter that runs the agent (None: the
    Slurm resource's; the tests pass a wrapper that puts a shim command first on PATH).

    The session starts no background thread: the supervisor's heartbeat and its head check
    (which would elect a head for the waiting workers) are not what these tests show."""
    config = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1,
                                      mem="200M", time_limit="00:10:00",
                                      heartbeat_timeout=300, heartbeat_interval=5)
    resource = slurm_resource(env)
    if python is not None:
        resource = SlurmResource(ssh=resource.ssh, queue=resource.queue,
                                 remote_base=resource.remote_base, python=python)
    return RunSession(resource, run_id or str(uuid.uuid4()), config,
                      RayLauncher(include_dashboard=False), activation=lambda: None,
                      background=False)
