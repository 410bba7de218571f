"""``ComputeResource``: run an asset's payload locally or on Slurm, through Dagster Pipes.

Configuration, validation and dispatch only; the work is done by one of the runners, which
share the template :class:`~dagster_slurm.jobs.runner.PipesJobRunner`:
:class:`~dagster_slurm.compute.local_runner.LocalRunner`,
:class:`~dagster_slurm.compute.slurm_runner.SlurmRunner` (asset scope) and
:class:`~dagster_slurm.session.frontend.runner.SessionRunner` (run scope). Every argument of
:meth:`ComputeResource.run` is checked before anything is submitted or started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from dagster import (
    ConfigurableResource,
    InitResourceContext,
    OpExecutionContext,
    PipesClientCompletedInvocation,
)
from pydantic import Field, field_validator, model_validator

from dagster_slurm.compute.asset_metadata import step_environment
from dagster_slurm.compute.hetjob import (
    HetJobComponent,
    check_components,
    het_overrides,
    local_component_env,
)
from dagster_slurm.compute.options import sbatch_overrides, validate_extras
from dagster_slurm.compute.partitioned import check_array_arguments, run_partitions
from dagster_slurm.compute.pipes_client import ComputePipesClient
from dagster_slurm.compute.published_fields import WITHDRAWN_FIELDS, published_mode
from dagster_slurm.compute.published_run import published_run, refuse_published_hetjob
from dagster_slurm.compute.run_config import SlurmRunConfig
from dagster_slurm.compute.scope import SlurmAllocationScope
from dagster_slurm.config_errors import KnownFieldsOnly, PublishedNames, WithdrawnField
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.activation import activation_for
from dagster_slurm.jobs.array_tasks import ArrayInvocation
from dagster_slurm.jobs.contexts import ExecutionContext, op_context
from dagster_slurm.jobs.follow import DEFAULT_RUN_STATUS_INTERVAL
from dagster_slurm.jobs.partitions import run_partition_keys
from dagster_slurm.jobs.pending import DEFAULT_FATAL_REASONS, PendingPolicy
from dagster_slurm.jobs.run_log import step_log_relay
from dagster_slurm.jobs.runner import JobRequest, PipesJobRunner
from dagster_slurm.launchers.base import ComputeLauncher, validate_env
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig, check_heartbeat_timeout
from dagster_slurm.session.head.layout import RunLayout
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.exec_limits import check_command


class ComputeResource(PublishedNames, ConfigurableResource, KnownFieldsOnly):
    """Runs payloads for assets: ``mode="local"`` as subprocesses, ``mode="slurm"`` as Slurm jobs.

    The same asset code works in both modes: ``yield from compute.run(context=context,
    payload_path="script.py").get_results()``.

    Keywords of the published package without a field here (``pack_on_remote``,
    ``debug_mode``, ``session`` ...) are refused with what to write instead
    (:data:`~dagster_slurm.compute.published_fields.WITHDRAWN_FIELDS`); ``session=None`` is
    dropped with a deprecation warning.
    """

    withdrawn_fields: ClassVar[tuple[WithdrawnField, ...]] = WITHDRAWN_FIELDS

    #: The :class:`RunSession` (sub)class of run-scoped sessions: a resource subclass sets
    #: it to use site-specific extension points (``make_allocation``,
    #: ``clone_allocation_config``). A class attribute, not configuration.
    session_class: ClassVar[type[RunSession]] = RunSession

    mode: Literal["local", "slurm"] = Field(
        default="local",
        description="'local': run payloads as subprocesses here; 'slurm': submit them to the cluster.",
    )
    slurm: SlurmResource | None = Field(
        default=None, description="The cluster and its queue defaults; required in slurm mode."
    )
    default_launcher: ComputeLauncher = Field(
        default_factory=BashLauncher,
        description="Launcher used when run() gets none (BashLauncher unless set).",
    )
    allocation_scope: SlurmAllocationScope = Field(
        default=SlurmAllocationScope.ASSET,
        description=(
            "'asset': one Slurm job per run() call. 'run': one allocation per Dagster run, "
            "submitted by the first step, shared by every step (Ray started once when "
            "default_launcher is a RayLauncher), cancelled when the run ends."
        ),
    )
    run_allocation: SlurmRunAllocationConfig | None = Field(
        default=None,
        description=(
            "Shape of the run's allocation with allocation_scope='run' (an error with 'asset'); "
            "fields left None take the Slurm resource's queue values. None: the queue "
            "configuration as it is."
        ),
    )
    ray_head_allocation: SlurmRunAllocationConfig | None = Field(
        default=None,
        description=(
            "With allocation_scope='run' and a RayLauncher: run the Ray head and the payload "
            "drivers in this small allocation of their own (its Ray node offers no CPUs or "
            "GPUs) and make run_allocation the run's first worker allocation, submitted "
            "again whenever the run has no live worker. partition and time_limit are "
            "required; unset, it asks for 1 node, 2 CPUs, 8 GB and no GPUs, with the queue's "
            "account, QoS and reservation (no other queue value). None: the run allocation "
            "hosts the head."
        ),
    )
    allow_short_heartbeat_timeout: bool = Field(
        default=False,
        description=(
            "Accept a heartbeat_timeout below 120 s (down to 5 s). Only where the base path's "
            "filesystem shows a write to every node at once: a single-host test cluster, "
            "local disk, NFS mounted with noac or actimeo=0."
        ),
    )
    heartbeat_timeout: float | None = Field(
        default=600.0,
        description=(
            "Asset scope: seconds without a status poll by the waiting step after which a "
            "job cancels itself (its dead-man's switch: a job whose step died ends even "
            "where no sensor runs); None disables it. At least 120 (a shared filesystem may "
            "show a heartbeat late), or 5 with allow_short_heartbeat_timeout. Run scope "
            "uses run_allocation.heartbeat_timeout instead."
        ),
    )
    pre_deployed_env_path: str | None = Field(
        default=None,
        description=(
            "Directory on the cluster with an activate.sh or a venv (bin/activate), sourced "
            "before the payload. None: pack the current environment and deploy it (cached)."
        ),
    )
    auto_detect_platform: bool = Field(
        default=True,
        description="Detect the cluster's Python platform when packing the environment.",
    )
    env_packages: list[str] | None = Field(
        default=None,
        description=(
            "Requirements to pack for the cluster instead of the whole current environment "
            "(e.g. ['dagster-pipes', 'numpy==2.1.0']); None packs the current environment."
        ),
    )
    fatal_pending_reasons: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_FATAL_REASONS),
        description=(
            "Pending reasons after which a job can never start as submitted, with advice; "
            "such a job is cancelled and the step fails after pending_grace_seconds."
        ),
    )
    pending_grace_seconds: float = Field(
        default=10.0, description="How long a job may show a fatal pending reason before it fails."
    )
    pending_log_interval: float = Field(
        default=30.0, description="Seconds between log lines while a job waits in the queue."
    )
    pipes_poll_interval: float = Field(
        default=0.25, description="Seconds between reads of the payload's messages and output."
    )
    run_status_interval: float = Field(
        default=DEFAULT_RUN_STATUS_INTERVAL,
        description=(
            "Seconds between reads of the step's own run status from the Dagster instance "
            "while it waits (submission, queue, payload, drain). A run that is no longer "
            "running (FAILURE, CANCELING, CANCELED: its run worker died, it was terminated) "
            "makes the step cancel its job or step and fail without a materialization."
        ),
    )
    local_base_path: str | None = Field(
        default=None,
        description="Local directory for invocation files in local mode; None: a per-user temp dir.",
    )
    efficiency_warning_below: float | None = Field(
        default=0.5,
        description=(
            "A multi-partition run whose tasks' mean CPU or memory efficiency is below this "
            "fraction logs a warning naming the request to lower; None: no warning."
        ),
    )
    published_metadata_keys: bool = Field(
        default=False,
        description=(
            "Also attach the job's figures under the published dagster-slurm package's "
            "metadata keys (slurm_job_id, node_hours, cpu_efficiency_pct, max_memory_mb, "
            "slurm_gpu_*, ...), besides the dagster_slurm/* keys, for dashboards and sensors "
            "that read those; in slurm mode only, each key only when its figure is known. "
            "False: only the dagster_slurm/* keys (a call's slurm_metrics still selects some)."
        ),
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _published_mode(cls, value: object) -> object:
        return published_mode(value)

    @field_validator("pending_grace_seconds", "pending_log_interval", "pipes_poll_interval",
                     "run_status_interval")
    @classmethod
    def _non_negative(cls, value: float, info: Any) -> float:
        positive = ("pipes_poll_interval", "run_status_interval")
        if value < 0 or (info.field_name in positive and value == 0):
            raise ValueError(f"{info.field_name}={value!r}: must be positive")
        return value

    @model_validator(mode="after")
    def _check_mode(self) -> ComputeResource:
        if self.mode == "slurm" and self.slurm is None:
            raise ValueError("mode='slurm' needs slurm=SlurmResource(...)")
        if self.pre_deployed_env_path is not None and not self.pre_deployed_env_path.startswith("/"):
            raise ValueError(
                f"pre_deployed_env_path={self.pre_deployed_env_path!r}: must be an absolute path on the cluster"
            )
        check_heartbeat_timeout(self.heartbeat_timeout, self.allow_short_heartbeat_timeout)
        if "heartbeat_timeout" in self.model_fields_set and \
                self.allocation_scope is SlurmAllocationScope.RUN:
            raise ConfigurationError(
                "heartbeat_timeout", self.heartbeat_timeout,
                "applies to asset-scope jobs only; with allocation_scope='run' set "
                "run_allocation=SlurmRunAllocationConfig(heartbeat_timeout=...) instead",
            )
        if self.run_allocation is not None and self.allocation_scope is SlurmAllocationScope.ASSET:
            raise ConfigurationError(
                "run_allocation", self.run_allocation.model_dump(exclude_defaults=True),
                "is used only with allocation_scope='run'; set allocation_scope='run' to share one "
                "allocation between the run's steps, or drop run_allocation (with 'asset' each "
                "step's job takes the Slurm resource's queue and its extra_slurm_opts)",
            )
        self.run_layout()  # a separate head: checked now, before anything is submitted
        return self

    def run_layout(self) -> RunLayout | None:
        """How the run session spreads over its allocations: with ``ray_head_allocation``,
        a :class:`~dagster_slurm.session.head.layout.RunLayout` (a head of its own shape
        whose Ray node offers no CPUs or GPUs; ``run_allocation`` as the first worker
        allocation it keeps); None without it (the session's allocation runs the steps).
        Raises :class:`ConfigurationError` naming the field that does not fit."""
        if self.ray_head_allocation is None:
            return None
        from dagster_slurm.session.head.layout import separate_head_layout

        return separate_head_layout(
            self.ray_head_allocation, self.run_allocation,
            run_scope=self.allocation_scope is SlurmAllocationScope.RUN,
            launcher=self.default_launcher,
            queue=self.slurm.queue if self.slurm is not None else None,
        )

    # -- the API assets call ---------------------------------------------------------------
    def run(
        self,
        context: ExecutionContext,
        payload_path: str,
        launcher: ComputeLauncher | None = None,
        extra_env: Mapping[str, str] | None = None,
        extras: Mapping[str, Any] | None = None,
        extra_slurm_opts: Mapping[str, Any] | None = None,
        defer_cleanup: bool = False,
        config: SlurmRunConfig | None = None,
        array_parallelism: int | None = None,
        array_retries: int = 0,
        **published: Any,
    ) -> PipesClientCompletedInvocation | ArrayInvocation:
        """Run ``payload_path`` for the current step and return the Pipes invocation.

        ``context``: the context Dagster passed to the asset, multi-asset, asset check or
        op (also an op of a graph-backed asset); see :mod:`dagster_slurm.jobs.contexts`.
        ``payload_path``: a local ``.py``/``.sh`` file (uploaded to the job directory) or a
        command such as ``python -m pkg.module``. ``launcher``: overrides
        ``default_launcher``. ``extra_env``: variables exported for the payload (one
        ``NAME=value`` at most 128 KiB, all at most 1 MiB together; see
        :mod:`dagster_slurm.slurm.exec_limits`). ``extras``: reach the payload as ``context.extras``. ``extra_slurm_opts``: per-step
        scheduler overrides (``nodes``, ``cpus_per_task``, ``mem``, ``gpus_per_node``,
        ``time_limit``, ``partition``, ...; checked in both modes, used in slurm mode).
        ``defer_cleanup``: keep the invocation's files until
        :meth:`cleanup_deferred_run_dir`. ``config``: the asset's
        :class:`~dagster_slurm.compute.run_config.SlurmRunConfig` (None: none); with
        ``skip_payload_upload`` a script already on the cluster runs in slurm mode. The
        asset's metadata ``slurm_pre_deployed_env_path`` names an environment of its own
        (:mod:`~dagster_slurm.compute.asset_metadata`). ``published``: other keywords of the
        published package's call form (``slurm_metrics``, ...), supported or refused naming
        the replacement (:mod:`dagster_slurm.compute.published_run`). Raises a
        :class:`~dagster_slurm.jobs.errors.SlurmJobError` subclass when the job fails.

        A step over several partition keys (a single-run backfill) runs the payload once per
        key, as one job array (slurm mode) or a pool of processes (local), at most
        ``array_parallelism`` at once (None: the queue's ``array_parallelism``, locally the
        CPU count), resubmitting failed keys up to ``array_retries`` times; it returns an
        :class:`~dagster_slurm.jobs.array_tasks.ArrayInvocation` and raises
        :class:`~dagster_slurm.jobs.array_tasks.SlurmArrayTasksFailed` (docs/arrays.md).
        """
        # -- validation: every argument, before anything is submitted or started --------
        call = published_run(published, mode=self.mode, payload_path=payload_path,
                             pre_deployed_env_path=self.pre_deployed_env_path,
                             published_metadata_keys=self.published_metadata_keys)
        payload_path = call.payload_path
        launcher = launcher or self.default_launcher
        if not isinstance(launcher, ComputeLauncher):
            raise ConfigurationError("launcher", launcher, "must be a ComputeLauncher such as BashLauncher()")
        if config is not None and not isinstance(config, SlurmRunConfig):
            raise ConfigurationError("config", config, "must be a SlurmRunConfig (or a subclass of it)")
        env = validate_env(dict(extra_env or {}))
        validate_extras(extras)
        overrides = sbatch_overrides(extra_slurm_opts)
        if not payload_path or not payload_path.strip():
            raise ConfigurationError("payload_path", payload_path, "must name a script or a command")
        if config is not None:
            payload_path = config.payload_for(payload_path, slurm_mode=self.mode == "slurm")
        check_command("payload_path", payload_path)
        op = op_context(context)  # the step's OpExecutionContext, whatever type it was given
        env_path = self._asset_environment(op)
        session = self._check_scope(op, launcher, overrides, extra_slurm_opts)
        parallelism, retries = check_array_arguments(array_parallelism, array_retries)
        request = JobRequest(payload_path, launcher, env, extras, overrides, defer_cleanup,
                             call.published_metrics)
        # -- dispatch ------------------------------------------------------------------------
        keys = run_partition_keys(op)
        if keys is not None:
            return run_partitions(
                self, op, request, keys, parallelism, retries, pending=self._pending_policy(),
                prepare_env=lambda ctx: self._prepare_environment(ctx, env_path))
        return self._runner(session, env_path).run(op, request)

    def run_hetjob(
        self,
        context: ExecutionContext,
        components: Sequence[HetJobComponent | Mapping[str, Any]] | None = None,
        payload_path: str | None = None,
        launcher: ComputeLauncher | None = None,
        extra_env: Mapping[str, str] | None = None,
        extras: Mapping[str, Any] | None = None,
        defer_cleanup: bool = False,
        **published: Any,
    ) -> PipesClientCompletedInvocation:
        """Experimental: run ``payload_path`` as one Slurm heterogeneous job whose
        ``components`` (two or more :class:`~dagster_slurm.compute.hetjob.HetJobComponent`,
        or mappings of their fields) each get their own partition, nodes, CPUs, memory and
        GPUs. The payload runs once, on the first node of component 0, and finds each
        component's nodes in ``SLURM_JOB_NODELIST_HET_GROUP_<n>`` (``SLURM_HET_SIZE``
        components); ``srun --het-group=<n>`` starts work on component ``n``. The other
        arguments and the result are those of :meth:`run`. In local mode the payload runs
        once here, the component variables naming ``localhost``. Not available with
        ``allocation_scope='run'``. See docs/hetjobs.md. The published package's form
        (``assets=``, ``launchers=``) is refused with a message that shows this one.
        """
        refuse_published_hetjob(components, published)
        call = published_run({}, mode=self.mode, payload_path=payload_path or "",
                             pre_deployed_env_path=self.pre_deployed_env_path,
                             published_metadata_keys=self.published_metadata_keys)
        launcher = launcher or self.default_launcher
        if not isinstance(launcher, ComputeLauncher):
            raise ConfigurationError("launcher", launcher, "must be a ComputeLauncher such as BashLauncher()")
        env = validate_env(dict(extra_env or {}))
        validate_extras(extras)
        checked = check_components(components)
        if not payload_path or not payload_path.strip():
            raise ConfigurationError("payload_path", payload_path, "must name a script or a command")
        check_command("payload_path", payload_path)
        op = op_context(context)
        if self.allocation_scope is SlurmAllocationScope.RUN:
            raise ConfigurationError(
                "allocation_scope", self.allocation_scope.value,
                "run_hetjob submits a heterogeneous job of its own, separate from the run's "
                "allocation; use a ComputeResource with allocation_scope='asset' for it",
            )
        overrides = het_overrides(checked)
        env_path = self._asset_environment(op)
        self._check_scope(op, launcher, overrides, None)
        if self.mode == "local":
            env = {**env, **local_component_env(checked)}
        request = JobRequest(payload_path, launcher, env, extras, overrides, defer_cleanup,
                             call.published_metrics)
        return self._runner(None, env_path).run(op, request)

    def _asset_environment(self, context: Any) -> str | None:
        """The step's own environment from its assets' metadata (None: the resource's
        settings), checked against the scope; raises for a key that is not honoured."""
        return step_environment(context, run_scope=self.allocation_scope is SlurmAllocationScope.RUN,
                                resource_path=self.pre_deployed_env_path)

    def get_pipes_client(self, context: Any = None,
                         launcher: ComputeLauncher | None = None) -> ComputePipesClient:
        """A Dagster ``PipesClient`` running :meth:`run` with ``launcher`` (None:
        ``default_launcher``), as in the published package; ``context`` is not used."""
        return ComputePipesClient(self, launcher)

    def _check_scope(self, context: OpExecutionContext, launcher: ComputeLauncher,
                     overrides: Mapping[str, Any],
                     extra_slurm_opts: Mapping[str, Any] | None) -> RunSession | None:
        """:func:`~dagster_slurm.compute.scope.check_scope` for this resource."""
        from dagster_slurm.compute.scope import check_scope

        return check_scope(self, context, launcher, overrides, extra_slurm_opts)

    def _runner(self, session: RunSession | None, env_path: str | None = None) -> PipesJobRunner:
        """The runner for this mode and scope (``session``: the run's, in run scope;
        ``env_path``: the step's own pre-deployed environment, None: the resource's)."""
        if self.mode == "local":
            from dagster_slurm.compute.local_runner import LocalRunner

            return LocalRunner(self.local_base_path,
                               poll_interval=min(self.pipes_poll_interval, LocalRunner.POLL_INTERVAL),
                               run_status_interval=self.run_status_interval)
        if session is not None:
            from dagster_slurm.session.frontend.runner import SessionRunner

            return SessionRunner(session, poll_interval=self.pipes_poll_interval)
        from dagster_slurm.compute.slurm_runner import SlurmRunner

        assert self.slurm is not None
        return SlurmRunner(self.slurm, self._pending_policy(),
                           lambda context: self._prepare_environment(context, env_path),
                           poll_interval=self.pipes_poll_interval,
                           run_status_interval=self.run_status_interval,
                           heartbeat_timeout=self.heartbeat_timeout)

    def _pending_policy(self) -> PendingPolicy:
        return PendingPolicy(self.fatal_pending_reasons, self.pending_log_interval,
                             self.pending_grace_seconds)

    def get_run_allocation_session(self, context: Any, *, start: bool = True) -> RunSession:
        """The run's allocation session in this process (slurm mode, ``allocation_scope='run'``).

        ``session.allocation`` is the current :class:`~dagster_slurm.session.core.allocation.SlurmAllocation`
        (submitted, or attached to, on first access); ``session.execute_in_session(...)``
        runs a command as a step without Pipes. With ``start`` the allocation is made ready
        now. ``context``: a context of the run, of any type (only its run, instance and log
        are read; see :mod:`dagster_slurm.jobs.contexts`). Raises
        :class:`~dagster_slurm.errors.ConfigurationError` in another mode or scope.
        """
        if self.mode != "slurm" or self.allocation_scope is not SlurmAllocationScope.RUN:
            raise ConfigurationError(
                "allocation_scope", self.allocation_scope.value,
                "a run allocation session exists only with mode='slurm' and allocation_scope='run'",
            )
        from dagster_slurm.session.frontend.lifecycle import run_session_for

        layout = self.run_layout()
        # with a separate head the session's allocation is the head; run_allocation is
        # the first worker allocation (in the layout)
        config = (self.ray_head_allocation if self.ray_head_allocation is not None
                  else self.run_allocation or SlurmRunAllocationConfig())
        session = run_session_for(
            self, context, config, self.default_launcher,
            pending=self._pending_policy(),
            poll_interval=self.pipes_poll_interval,
            run_status_interval=self.run_status_interval,
            session_class=self.session_class,
            layout=layout,
        )
        if start:
            step_log = getattr(context, "log", None)
            with step_log_relay(step_log):
                session.ensure(step_log)
        return session

    def cleanup_deferred_run_dir(self, context: ExecutionContext) -> None:
        """Remove the files kept by ``run(..., defer_cleanup=True)`` for this step
        (``context``: as for :meth:`run`)."""

        from dagster_slurm.compute.cleanup import remove_deferred_files

        remove_deferred_files(self, context)

    # -- lifecycle -------------------------------------------------------------------------
    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Register this run as a user of the process's cluster connection."""
        if self.mode == "slurm" and self.slurm is not None:
            self.slurm.acquire()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """The last run of this process using the cluster ends the cluster-side agent
        processes and the SSH connection (nothing of the library stays on the login node)."""
        if self.mode == "slurm" and self.slurm is not None:
            try:
                if self.allocation_scope is SlurmAllocationScope.RUN:
                    from dagster_slurm.session.frontend.lifecycle import close_run_sessions

                    close_run_sessions(context)
            finally:
                self.slurm.release()

    def _prepare_environment(self, context: OpExecutionContext,
                             env_path: str | None = None) -> str | None:
        """The activation script on the cluster (of ``env_path``, a step's own pre-deployed
        environment, when given); prepared once per process and settings
        (:func:`dagster_slurm.environment.prepare_environment` caches it)."""

        return activation_for(self, context, pre_deployed_env_path=env_path)
