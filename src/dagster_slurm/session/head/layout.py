"""A run's Ray cluster laid out over a head allocation and worker allocations from the start.

Two resources configure such a layout (a :class:`RunLayout` handed to the run's
:class:`~dagster_slurm.session.session.RunSession`):

* ``ComputeResource(ray_head_allocation=SlurmRunAllocationConfig(...))``: the Ray head and
  the payload drivers run in a small allocation of their own (:func:`separate_head_layout`).
  Its request is :func:`~dagster_slurm.session.core.worker_config.head_queue_config` (explicit
  partition and time limit; one node, 2 CPUs, 8 GB, no GPUs unless set; the queue's account,
  QoS and reservation, nothing else of the queue), and its Ray node advertises no CPUs and
  no GPUs. ``run_allocation`` becomes the run's first worker allocation
  (:func:`~dagster_slurm.session.core.worker_config.first_worker_config`).
* ``SlurmSessionResource(ray_head_only=True, num_nodes=1, worker_allocation=...)``
  (:func:`session_resource_layout`): the head is the resource's ``run_allocation`` (its
  request as usual, on one node), its Ray node advertises no CPUs or GPUs, and
  ``worker_allocation`` (its unset fields from the head's request) is the first worker
  allocation. ``worker_allocation`` without ``ray_head_only`` keeps the head's CPUs and GPUs
  in the cluster and adds the worker allocation to them.

Keeping a worker allocation for such a run is :mod:`dagster_slurm.session.workers.keep`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.worker_config import (
    SlurmWorkerAllocationConfig,
    check_head_allocation,
    first_worker_config,
    head_queue_config,
    resolve_worker_config,
)
from dagster_slurm.slurm.queue import SlurmQueueConfig

if TYPE_CHECKING:
    pass

log = logging.getLogger("dagster_slurm.session")

#: Fields of a run allocation configuration that belong to the session's allocation (its
#: heartbeat and startup), not to a worker allocation.
SESSION_FIELDS: tuple[str, ...] = (
    "heartbeat_interval", "heartbeat_timeout", "allow_short_heartbeat_timeout", "startup_timeout",
)


@dataclass(frozen=True)
class RunLayout:
    """How a run's Ray cluster is spread over its allocations from the start.

    ``first_worker``: the worker allocation submitted whenever the session has no live one
    (resolved: every Slurm field set that the request needs). ``head_only``: the head's Ray
    node advertises no CPUs and no GPUs (True for a separate head). ``head_defaults``: the
    head's request is :func:`head_queue_config` (a ``ComputeResource``'s
    ``ray_head_allocation``) rather than the configuration applied to the queue.
    ``field``: the head's configuration as the user spelled it, for error messages.
    """

    first_worker: SlurmWorkerAllocationConfig
    head_only: bool = True
    head_defaults: bool = True
    field: str = "ray_head_allocation"

    def head_request(self, config: SlurmRunAllocationConfig,
                     queue: SlurmQueueConfig) -> SlurmQueueConfig:
        """The head allocation's request for its configuration ``config`` and the Slurm
        resource's ``queue``; raises :class:`ConfigurationError` naming the field."""
        if self.head_defaults:
            return head_queue_config(queue, config, self.field)
        return config.queue_for(queue)

    def head_launcher(self, launcher: ComputeLauncher) -> ComputeLauncher:
        """The launcher that renders the head allocation's script: ``launcher`` itself, or,
        with ``head_only``, a copy whose Ray node offers ``--num-cpus=0 --num-gpus=0`` (Ray
        then places no task or actor that requests resources on the head)."""
        if not self.head_only:
            return launcher
        # model_copy does not validate: num_cpus_per_node=0 is refused in configuration
        # (a compute node offers at least one CPU), but it is what a head-only node offers.
        return launcher.model_copy(update={"num_cpus_per_node": 0, "num_gpus_per_node": 0})

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able description, part of the session's digest: resources with other
        layouts (another first worker allocation, a head that keeps its CPUs) get other
        sessions."""
        return {"first_worker": self.first_worker.snapshot(), "head_only": self.head_only,
                "head_defaults": self.head_defaults}


def head_request(config: SlurmRunAllocationConfig, queue: SlurmQueueConfig,
                 layout: RunLayout | None) -> SlurmQueueConfig:
    """The session allocation's request: ``layout``'s head request, else ``config`` applied
    to ``queue`` (the run allocation as usual)."""
    return config.queue_for(queue) if layout is None else layout.head_request(config, queue)


def _is_ray(launcher: ComputeLauncher) -> bool:
    from dagster_slurm.launchers.ray import RayLauncher

    return isinstance(launcher, RayLauncher)


def _shown(config: Any) -> Any:
    return config.model_dump(exclude_defaults=True) if config is not None else None


def separate_head_layout(
    ray_head_allocation: SlurmRunAllocationConfig,
    run_allocation: SlurmRunAllocationConfig | None,
    *,
    run_scope: bool,
    launcher: ComputeLauncher,
    queue: SlurmQueueConfig | None,
) -> RunLayout:
    """The layout of ``ComputeResource(ray_head_allocation=...)``, checked before anything is
    submitted: ``allocation_scope='run'`` (``run_scope``), a RayLauncher as default launcher,
    an explicit ``partition`` and ``time_limit`` on ``ray_head_allocation``, no session
    setting (heartbeat, startup) on ``run_allocation`` (the session's allocation is the
    head), and, with the Slurm resource's ``queue`` (None: local mode, no queue), requests
    that combine with it. Errors name the field as the resource spells it."""
    if not run_scope:
        raise ConfigurationError(
            "ray_head_allocation", _shown(ray_head_allocation),
            "a separate head exists only for a run's shared allocation: set "
            "allocation_scope='run', or drop ray_head_allocation",
        )
    if not _is_ray(launcher):
        raise ConfigurationError(
            "default_launcher", type(launcher).__name__,
            "ray_head_allocation runs the Ray head in its own allocation and needs a "
            "RayLauncher as default_launcher (e.g. default_launcher=RayLauncher())",
        )
    check_head_allocation(ray_head_allocation, "ray_head_allocation")
    worker_source = run_allocation or SlurmRunAllocationConfig()
    for name in SESSION_FIELDS:
        # by value: Dagster rebuilds a resource's nested config with every field given
        if getattr(worker_source, name) != SlurmRunAllocationConfig.model_fields[name].default:
            raise ConfigurationError(
                f"run_allocation.{name}", getattr(worker_source, name),
                "with ray_head_allocation set, the session's allocation is the head and "
                f"run_allocation describes worker allocations: set {name} on "
                "ray_head_allocation instead",
            )
    with _prefixed("run_allocation"):
        first = first_worker_config(worker_source, queue or SlurmQueueConfig())
    layout = RunLayout(first_worker=first)
    if queue is not None:
        with _prefixed("ray_head_allocation"):
            layout.head_request(ray_head_allocation, queue)  # raises on a bad combination
    return layout


@contextmanager
def _prefixed(owner: str) -> Iterator[None]:
    """A :class:`ConfigurationError` raised inside names its field below ``owner``
    (``time_min`` becomes ``run_allocation.time_min``)."""
    try:
        yield
    except ConfigurationError as error:
        if error.field.startswith(f"{owner}."):
            raise
        raise ConfigurationError(f"{owner}.{error.field}", error.value, error.problem) from None


def session_resource_layout(
    run_allocation: SlurmRunAllocationConfig,
    *,
    ray_head_only: bool,
    worker_allocation: SlurmWorkerAllocationConfig | None,
    launcher: ComputeLauncher,
    queue: SlurmQueueConfig,
) -> RunLayout | None:
    """The layout of a ``SlurmSessionResource`` (None without ``worker_allocation`` and
    ``ray_head_only``), checked: ``ray_head_only=True`` needs ``worker_allocation`` and one
    node (``run_allocation``, with the resource's ``num_nodes`` applied, on ``queue``);
    either needs a RayLauncher as ``launcher``. ``worker_allocation``'s unset fields come
    from the head's request."""
    if not ray_head_only and worker_allocation is None:
        return None
    if ray_head_only and worker_allocation is None:
        raise ConfigurationError(
            "worker_allocation", None,
            "ray_head_only=True leaves the head without CPUs or GPUs for work: set "
            "worker_allocation=SlurmWorkerAllocationConfig(...) for the nodes that do it",
        )
    assert worker_allocation is not None
    if not _is_ray(launcher):
        raise ConfigurationError(
            "launcher", type(launcher).__name__,
            ("ray_head_only" if ray_head_only else "worker_allocation")
            + " needs a RayLauncher as launcher: worker allocations join the run's Ray cluster",
        )
    head = run_allocation.queue_for(queue)
    if ray_head_only and (head.num_nodes or 1) != 1:
        raise ConfigurationError(
            "num_nodes", head.num_nodes,
            "ray_head_only=True needs num_nodes=1 (the value of num_nodes, else of "
            "run_allocation.num_nodes, else the queue's): the head allocation hosts only the "
            "Ray head and the payload drivers; put the compute nodes in worker_allocation",
        )
    first = resolve_worker_config(worker_allocation, None, head)
    return RunLayout(first_worker=first, head_only=ray_head_only, head_defaults=False,
                     field="run_allocation")
