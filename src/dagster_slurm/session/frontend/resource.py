"""``SlurmSessionResource``: a run session configured on its own, for steps without Pipes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, field_validator, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly, PublishedNames, RenamedField
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.contexts import step_identity
from dagster_slurm.jobs.follow import DEFAULT_RUN_STATUS_INTERVAL
from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.session.core.allocation import SlurmAllocation
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SlurmStepExecutionResult
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.frontend.delegation import session_method
from dagster_slurm.session.head.layout import RunLayout, session_resource_layout
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.validation import validate_count

#: Allocation fields the published package's SlurmSessionResource took directly (the "flat"
#: form, ``SlurmSessionResource(slurm=..., time_limit=...)``); here they belong to
#: ``run_allocation``. ``num_nodes`` is a field of both.
FLAT_ALLOCATION_FIELDS: tuple[str, ...] = (
    "time_limit", "signal_before_timeout", "partition", "gpus_per_node", "cpus_per_task",
    "mem", "mem_per_cpu", "qos", "account", "reservation", "nodelist",
)


class SlurmSessionResource(PublishedNames, ConfigurableResource, KnownFieldsOnly):
    """One allocation per Dagster run, shared by the run's steps, with explicit settings.

    ``get_session(context)`` returns the run's session in this process (the same object
    ``ComputeResource.get_run_allocation_session`` returns for its own settings);
    ``execute_in_session(context, command)`` runs a command as a step of the allocation
    and returns a :class:`~dagster_slurm.session.core.errors.SlurmStepExecutionResult`;
    ``submit_successor`` / ``promote_successor`` carry the run on in a successor allocation
    (the session's methods of the same names); ``add_worker_allocation``,
    ``wait_for_worker_allocation``, ``remove_worker_allocation`` and ``worker_allocations``
    grow and shrink its Ray cluster with worker allocations, and ``worker_sbatch_options``
    and ``estimate_worker_starts`` tell what candidate worker allocations would request and
    when the scheduler expects them to start. The
    allocation is cancelled at the run's teardown (see :mod:`dagster_slurm.session.frontend.lifecycle`).
    Each method takes the context Dagster passed to the step, of any type (an asset,
    multi-asset, asset-check or op context; see :mod:`dagster_slurm.jobs.contexts`).

    ``session_class`` (a class attribute, not configuration): the :class:`RunSession`
    subclass a resource subclass builds its sessions with, for site-specific allocations
    (its ``make_allocation`` and ``clone_allocation_config`` extension points).

    ``ray_head_only=True``, ``num_nodes=1`` and ``worker_allocation=`` lay the run out as a
    head allocation that hosts only the Ray head and the payload drivers (its Ray node
    offers no CPUs or GPUs) plus worker allocations that do the work; the worker
    allocation is submitted again whenever the run has none left (see
    :mod:`dagster_slurm.session.head.layout`).

    The published package's flat form (``time_limit=``, ``partition=``, ``qos=`` ... given
    to the resource itself) is accepted for the same fields of ``run_allocation``
    (:data:`FLAT_ALLOCATION_FIELDS`), with a deprecation warning.
    """

    renamed_fields: ClassVar[tuple[RenamedField, ...]] = tuple(
        RenamedField(name, f"run_allocation.{name}") for name in FLAT_ALLOCATION_FIELDS
    )

    session_class: ClassVar[type[RunSession]] = RunSession

    slurm: SlurmResource = Field(description="The cluster and its queue defaults.")
    run_allocation: SlurmRunAllocationConfig = Field(
        default_factory=SlurmRunAllocationConfig,
        description="Shape of the allocation; fields left None take the queue's values.",
    )
    launcher: ComputeLauncher = Field(
        default_factory=BashLauncher,
        description="Launcher of the allocation: a RayLauncher starts Ray once in it.",
    )
    num_nodes: int | None = Field(
        default=None,
        description=(
            "Nodes of the session's allocation, as run_allocation.num_nodes (set one of the "
            "two). None: run_allocation's, else the queue's."
        ),
    )
    ray_head_only: bool = Field(
        default=False,
        description=(
            "The session's allocation hosts only the Ray head and the payload drivers: its "
            "Ray node offers no CPUs or GPUs, and the work runs in worker_allocation's "
            "nodes. Needs worker_allocation, num_nodes=1 and a RayLauncher."
        ),
    )
    worker_allocation: SlurmWorkerAllocationConfig | None = Field(
        default=None,
        description=(
            "The run's first worker allocation (its unset fields from the session's "
            "allocation), whose nodes join the run's Ray cluster; submitted again whenever "
            "the run has no live worker allocation. Needs a RayLauncher. None: no worker "
            "allocation unless added with add_worker_allocation."
        ),
    )
    pre_deployed_env_path: str | None = Field(
        default=None,
        description="Environment on the cluster to activate (None: pack the current one).",
    )
    auto_detect_platform: bool = Field(
        default=True, description="Detect the cluster's Python platform when packing."
    )
    env_packages: list[str] | None = Field(
        default=None, description="Requirements to pack instead of the whole current environment."
    )
    poll_interval: float = Field(default=0.25, description="Seconds between step status reads.")
    run_status_interval: float = Field(
        default=DEFAULT_RUN_STATUS_INTERVAL, gt=0,
        description=(
            "Seconds between reads of the run's status from the Dagster instance while the "
            "session waits; a run that is no longer running stops the wait."
        ),
    )

    @field_validator("num_nodes")
    @classmethod
    def _check_nodes(cls, value: int | None) -> int | None:
        return None if value is None else validate_count("num_nodes", value, minimum=1)

    @model_validator(mode="after")
    def _check_layout(self) -> SlurmSessionResource:
        self._head_config()
        self.run_layout()  # ray_head_only / worker_allocation: checked before any submission
        return self

    def _head_config(self) -> SlurmRunAllocationConfig:
        """``run_allocation`` with ``num_nodes`` applied (the session allocation's config)."""
        config = self.run_allocation
        if self.num_nodes is None or config.num_nodes == self.num_nodes:
            return config
        if config.num_nodes is not None:
            raise ConfigurationError(
                "num_nodes", self.num_nodes,
                f"differs from run_allocation.num_nodes={config.num_nodes}; set one of the two",
            )
        return type(config)(**{**config.model_dump(), "num_nodes": self.num_nodes})

    def run_layout(self) -> RunLayout | None:
        """How the session spreads over its allocations: with ``worker_allocation``, a
        :class:`~dagster_slurm.session.head.layout.RunLayout` (``worker_allocation`` as the
        first worker allocation the head keeps; with ``ray_head_only`` the head's Ray node
        offers no CPUs or GPUs); None without it. Raises
        :class:`~dagster_slurm.errors.ConfigurationError` naming the field that does not fit."""
        return session_resource_layout(
            self._head_config(), ray_head_only=self.ray_head_only,
            worker_allocation=self.worker_allocation, launcher=self.launcher,
            queue=self.slurm.queue,
        )

    def get_session(self, context: Any) -> RunSession:
        """This process's session of the context's run (nothing is submitted yet)."""
        from dagster_slurm.session.frontend.lifecycle import run_session_for

        return run_session_for(self, context, self._head_config(), self.launcher,
                               poll_interval=self.poll_interval,
                               run_status_interval=self.run_status_interval,
                               session_class=self.session_class,
                               layout=self.run_layout())

    def get_run_allocation_session(self, context: Any, *, start: bool = True) -> RunSession:
        """The run's session in this process, as ``ComputeResource.get_run_allocation_session``
        returns it: the object that carries the session's operations. With ``start`` the
        allocation is submitted (or attached to) and made ready now."""
        session = self.get_session(context)
        if start:
            session.ensure(getattr(context, "log", None))
        return session

    def allocation(self, context: Any) -> SlurmAllocation:
        """The run's current allocation (submitted or attached to, and ready)."""
        return self.get_session(context).ensure(getattr(context, "log", None))

    # The session's operations on the context's run, with the session methods' signatures
    # (their parameters after ``context``, their defaults; ``logger`` is ``context.log``).
    replace_head = session_method("replace_head")
    submit_successor = session_method("submit_successor")
    promote_successor = session_method("promote_successor")
    inspect = session_method("inspect")
    reconcile_workers = session_method("reconcile_workers")
    assign_worker_intent = session_method("assign_worker_intent")
    add_worker_allocation = session_method("add_worker_allocation")
    wait_for_worker_allocation = session_method("wait_for_worker_allocation")
    remove_worker_allocation = session_method("remove_worker_allocation")
    worker_allocations = session_method("list_worker_allocations", "worker_allocations")
    worker_sbatch_options = session_method("worker_sbatch_options")
    estimate_worker_starts = session_method("estimate_worker_starts")

    def execute_in_session(
        self,
        context: Any,
        command: str | Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        raise_on_error: bool = True,
    ) -> SlurmStepExecutionResult:
        """Run ``command`` as a step of the run's allocation; see
        :meth:`RunSession.execute_in_session`. ``name`` defaults to the step key."""
        if name is None:
            name = step_identity(context)[1]
        return self.get_session(context).execute_in_session(
            command, name=name, env=env, raise_on_error=raise_on_error,
            logger=getattr(context, "log", None),
        )

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self.slurm.acquire()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        from dagster_slurm.session.frontend.lifecycle import close_run_sessions

        try:
            close_run_sessions(context)
        finally:
            self.slurm.release()
