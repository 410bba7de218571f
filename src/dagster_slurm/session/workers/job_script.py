"""The batch script of a worker allocation and its sbatch request (pure rendering).

``templates/ray_worker.sh`` after the common job prologue (``templates/job_common.sh``,
which activates the run's environment): the allocation's nodes join the Ray head named in
``<session dir>/ray_head`` and follow it when another head rewrites the file; see the
template's header for the files it writes (``jobs/<job id>/nodes``, ``ray_nodes``,
``state``) and how it drains. Each node starts with the run launcher's node functions
(:meth:`RayLauncher.node_functions`, :meth:`RayLauncher.port_functions`): the launcher's
settings, port strategy, password (in the environment, never on a command line) and
``pre_start_commands``; this allocation's ``gpus_per_node`` GPUs, the CPUs Slurm granted on
the node (unless the launcher sets ``num_cpus_per_node``), the custom resources
``{"dagster_slurm_worker": 1, **ray_resources}`` and its ``ray_start_args`` after the
launcher's, so that they win (``ray start`` takes the last value of a repeated option).
"""

from __future__ import annotations

import json
import math

from dagster_slurm.jobs.signals import drain_signal_of
from dagster_slurm.launchers.base import DEFAULT_DRAIN_SIGNAL, ExecutionPlan
from dagster_slurm.launchers.ray import RAY_STOP_GRACE_SECONDS, RayLauncher
from dagster_slurm.launchers.script import render_prologue, render_template
from dagster_slurm.protocol import REMOVAL_SIGNAL, WORKER_DRAINING, WORKER_RELEASED
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.worker_config import WORKER_RESOURCE, SlurmWorkerAllocationConfig
from dagster_slurm.slurm.commands import SbatchSpec
from dagster_slurm.slurm.validation import signal_lead_seconds

WORKER_TEMPLATE = "ray_worker.sh"

#: Seconds before a node whose Ray ended (while its head is live) starts again: one entry
#: per restart; the node's next end keeps it out until the allocation joins another head.
RESTART_DELAYS: tuple[int, ...] = (5, 15, 45)

# The signal the session sends after writing the drain file (REMOVAL_SIGNAL), the margin
# before the walltime at which a drain on the pre-walltime signal ends, and the state words
# the session reads (draining, released) are defined in dagster_slurm.protocol; the template
# gets them from the renderer.

#: Seconds a drain lasts when the removal signal arrives without a drain file (sent by hand).
DEFAULT_DRAIN_SECONDS = 600

#: Words of the worker allocation's state file (``jobs/<job id>/state``).
STATE_WAITING = "waiting"
STATE_JOINED = "joined"
STATE_PARTIAL = "partial"
STATE_DRAINING = WORKER_DRAINING
RELEASED_PREFIX = WORKER_RELEASED
RELEASE_REASONS: tuple[str, ...] = ("drained", "no_head", "cancelled")

#: python3 program run in the batch shell (with the ray package of the run's environment)
#: against the head's GCS. ``ids <gcs> <address>:<node manager port>...`` prints ``<item>
#: <node id>`` for each item an ALIVE Ray node matches (the latest started); ``states <gcs>
#: <node id>...`` prints ``<node id> alive|gone``. Exit status non-zero: the GCS did not
#: answer (no verdict).
NODE_QUERY = r"""
import sys


def rows(address):
    try:
        from ray._raylet import GcsClient
    except ImportError:
        GcsClient = None
    if GcsClient is not None:
        infos = GcsClient(address=address).get_all_node_info(timeout=20)
        return [(node.hex(), info.node_manager_address, int(info.node_manager_port),
                 info.state == 0, int(info.start_time_ms)) for node, info in infos.items()]
    import ray
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return [(n["NodeID"], n["NodeManagerAddress"], int(n["NodeManagerPort"]), bool(n["Alive"]), 0)
            for n in ray.nodes()]


def main(mode, address, *items):
    known = rows(address)
    for item in items:
        if mode == "ids":
            host, _, port = item.rpartition(":")
            alive = sorted((r for r in known if r[1] == host and str(r[2]) == port and r[3]),
                           key=lambda r: r[4])
            if alive:
                print(item, alive[-1][0])
        else:
            print(item, "alive" if any(r[0] == item and r[3] for r in known) else "gone")


main(*sys.argv[1:])
"""


def worker_resources(config: SlurmWorkerAllocationConfig) -> str:
    """The ``--resources`` JSON of every node of the allocation: ``dagster_slurm_worker``
    (one per node) and the configuration's ``ray_resources``."""
    return json.dumps({WORKER_RESOURCE: 1, **config.ray_resources}, sort_keys=True)


def worker_start_args(launcher: RayLauncher, config: SlurmWorkerAllocationConfig) -> list[str]:
    """The options each node's ``ray start`` gets after the launcher's own: the launcher's
    ``ray_start_args``, the worker resources, then the allocation's ``ray_start_args`` (the
    last value of an option wins)."""
    return [*launcher.ray_start_args, f"--resources={worker_resources(config)}",
            *config.ray_start_args]


def worker_plan(paths: SessionPaths, token: str, activation: str | None) -> ExecutionPlan:
    """The prologue's plan of submission ``token``: its files in the submission's directory,
    the run's ``activation`` script (None: none), drain signal
    :data:`~dagster_slurm.protocol.REMOVAL_SIGNAL`, no watchdog (without a live head the
    allocation releases itself after ``rejoin_timeout``)."""
    submit_dir = paths.submit_dir(token)
    return ExecutionPlan(
        payload=("true",), job_dir=submit_dir, status_file=f"{submit_dir}/worker_status",
        drain_file=f"{submit_dir}/worker_drain_signal", mode="slurm", activation=activation,
        drain_signal=REMOVAL_SIGNAL,
    )


def render_worker(*, paths: SessionPaths, launcher: RayLauncher,
                  config: SlurmWorkerAllocationConfig, activation: str | None,
                  token: str, restart_delays: tuple[int, ...] = RESTART_DELAYS,
                  server_drain_signal: str = DEFAULT_DRAIN_SIGNAL) -> str:
    """The batch script of worker submission ``token`` (``config`` resolved);
    ``restart_delays``: seconds before each restart of a node (:data:`RESTART_DELAYS`);
    ``server_drain_signal``: the drain signal of the step server it starts when it hosts
    the head (the session's), sent to that server when the allocation drains."""
    walltime = drain_signal_of(config.signal_before_timeout) or ""
    lead = signal_lead_seconds(config.signal_before_timeout) if config.signal_before_timeout else None
    return render_template(
        WORKER_TEMPLATE,
        {
            "session_dir": paths.session_dir,
            "rejoin_timeout": str(math.ceil(config.rejoin_timeout)),
            "walltime_signal": walltime,
            "drain_lead": "" if lead is None else str(int(lead)),
            "default_drain": str(DEFAULT_DRAIN_SECONDS),
            "startup_timeout": str(math.ceil(launcher.startup_timeout)),
            "server_drain_signal": server_drain_signal,
            "stop_grace": str(RAY_STOP_GRACE_SECONDS),
            "restart_delays": [str(delay) for delay in restart_delays],
            "max_restarts": str(len(restart_delays)),
            "node_query": NODE_QUERY,
            "redis_password": launcher.redis_password or "",
            "num_gpus": str(config.gpus_per_node or 0),
            "ray_start_args": worker_start_args(launcher, config),
            "head_start_args": [*launcher.ray_start_args, "--num-cpus=0", "--num-gpus=0"],
            "step_server": f"{paths.submit_dir(token)}/step_server.sh",
        },
        {
            "prologue": render_prologue(worker_plan(paths, token, activation), launcher="ray_worker"),
            "ports": launcher.port_functions(),
            "node": launcher.node_functions("slurm"),
        },
    )


def worker_submission(*, paths: SessionPaths, job_name: str, launcher: RayLauncher,
                      config: SlurmWorkerAllocationConfig, activation: str | None,
                      token: str, server_drain_signal: str = DEFAULT_DRAIN_SIGNAL,
                      ) -> tuple[SbatchSpec, dict[str, tuple[str | bytes, int]]]:
    """The sbatch request of a worker allocation and the files it needs: the batch script
    (``<submit dir>/worker.sh``, mode 0600; the step server it starts when it hosts the
    head, ``<submit dir>/step_server.sh``, is rendered by the session). ``config`` must be resolved
    (:func:`~dagster_slurm.session.core.worker_config.resolve_worker_config`); the job carries
    ``job_name`` (the session's: teardown's ``scancel --name`` ends it) and writes its
    output to the session's ``allocation-<job id>.log``."""
    script = f"{paths.submit_dir(token)}/worker.sh"
    spec = config.to_sbatch_spec(job_name, script, output=paths.output, error=paths.output,
                                 chdir=paths.session_dir)
    text = render_worker(paths=paths, launcher=launcher, config=config,
                         activation=activation, token=token,
                         server_drain_signal=server_drain_signal)
    return spec, {script: (text, 0o600)}
