"""The Ray launcher: a Ray cluster for the payload, started by the job script itself.

:class:`RayLauncher` holds the launcher's settings, checks them and renders the job script
from them. What the script does (one Ray node per host of the allocation, the payload on the
head with ``RAY_ADDRESS`` set, the nodes stopped afterwards) and its contract (exit statuses,
output lines) are described in :mod:`dagster_slurm.launchers.ray_script`; what Ray and the
launcher allow in the settings in :mod:`dagster_slurm.launchers.ray_limits`; the port blocks
in :mod:`dagster_slurm.launchers.ray_ports`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from dagster_slurm.config_errors import PublishedNames, RenamedField
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.launchers.ray_limits import (
    HOST_ADDRESS,
    MIN_OBJECT_STORE_MEMORY,
    NETWORK_INTERFACE,
    RAY_MANAGED_OPTIONS,
    RAY_START_RULES,
    TEMP_DIR_MAX,
    check_temp_dir,
    has_control_characters,
)
from dagster_slurm.launchers.ray_ports import (
    HIGHEST_PORT,
    LOWEST_PORT,
    PORT_OFFSETS,
    PortStrategy,
    RayPortConfig,
    port_block_functions,
)
from dagster_slurm.launchers.ray_published import move_include_dashboard
from dagster_slurm.launchers.ray_script import (
    RAY_DASHBOARD_FORMAT,
    RAY_NODE_TEMPLATE,
    RAY_START_FAILED_STATUS,
    RAY_STOP_GRACE_SECONDS,
    RAY_TEMPLATE,
    RAY_TUNNEL_FORMAT,
)
from dagster_slurm.launchers.script import optional_word, render_prologue, render_template
from dagster_slurm.slurm.directives import validate_option_entries
from dagster_slurm.slurm.exec_limits import check_argument

#: The public names: the launcher, and the constants of its script contract and of its
#: refused ``ray start`` options that other packages use (defined in ``ray_script`` and
#: ``ray_limits``, importable from here as before).
__all__ = [
    "RAY_MANAGED_OPTIONS",
    "RAY_START_FAILED_STATUS",
    "RAY_STOP_GRACE_SECONDS",
    "RayLauncher",
]

GIGABYTE = 1_000_000_000
"""Bytes in a gigabyte of the published ``object_store_memory_gb`` (a decimal gigabyte)."""


def _gigabytes(value: object) -> int | None:
    """``object_store_memory_gb`` (published name) in bytes; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            "object_store_memory_gb", value,
            "must be a number of gigabytes (1 GB = 10**9 bytes) or None",
        )
    return int(round(value * GIGABYTE))


class RayLauncher(PublishedNames, ComputeLauncher):
    """Starts a Ray cluster inside the job, runs the payload on its head, then stops it.

    ``slurm`` mode: one Ray node per host of the allocation (the head on the first); local
    mode: one Ray node on this machine. The payload finds the cluster through
    ``RAY_ADDRESS``. :mod:`dagster_slurm.launchers.ray_script` describes the script's
    behaviour.

    The published package's ``object_store_memory_gb=`` (gigabytes of 10**9 bytes) and
    ``head_startup_timeout=`` are accepted for ``object_store_memory`` (bytes) and
    ``startup_timeout``, and its ``ray_start_args=["--include-dashboard=false"]`` for
    ``include_dashboard=False`` (:mod:`dagster_slurm.launchers.ray_published`), with a
    deprecation warning.
    """

    renamed_fields: ClassVar[tuple[RenamedField, ...]] = (
        RenamedField("object_store_memory_gb", "object_store_memory", convert=_gigabytes),
        RenamedField("head_startup_timeout", "startup_timeout"),
    )

    num_cpus_per_node: int | None = Field(
        default=None,
        description=(
            "CPUs each Ray node offers. None: the CPUs Slurm granted on that node "
            "(SLURM_CPUS_ON_NODE); in local mode the machine's CPUs."
        ),
    )
    num_gpus_per_node: int = Field(
        default=0,
        description=(
            "GPUs each Ray node offers (Ray does not detect Slurm's GPUs by itself). Request "
            "as many from Slurm, e.g. extra_slurm_opts={'gpus_per_node': N}."
        ),
    )
    working_dir: str | None = Field(
        default=None,
        description=(
            "Directory the payload runs in, relative to the job directory or absolute; it "
            "must exist. None: the job directory."
        ),
    )
    port_strategy: PortStrategy = Field(
        default="random",
        description=(
            "How each node picks its port block: 'random' (a random free block, locked with "
            "flock and checked for listeners; falls back to 'hash_jobid' without flock), "
            "'hash_jobid' (derived from the job id and node index, unchecked) or 'fixed' "
            "(node i uses block i of the range, ray_port and dashboard_port as set)."
        ),
    )
    port_config: RayPortConfig = Field(
        default_factory=RayPortConfig,
        description="The port range blocks come from, the block size and the lock directory.",
    )
    ray_port: int | None = Field(
        default=None,
        description="GCS port of the head. None: the first port of the head's block.",
    )
    dashboard_port: int | None = Field(
        default=None,
        description="Dashboard port of the head. None: taken from the head's block.",
    )
    network_interface: str | None = Field(
        default=None,
        description=(
            "Interface whose IPv4 address each node uses (e.g. 'ib0'). None: the first "
            "address of 'hostname -i' (127.0.0.1 in local mode)."
        ),
    )
    node_ip_address_command: str | None = Field(
        default=None,
        description=(
            "Shell command run on each node that prints that node's IP address (one "
            "address); overrides network_interface."
        ),
    )
    head_node_address: str | None = Field(
        default=None,
        description=(
            "Address the workers and the payload use to reach the head. None: the address "
            "the head node determined for itself."
        ),
    )
    ray_start_args: list[str] = Field(
        default_factory=list,
        description=(
            "Extra options appended to every node's 'ray start', one '--option[=value]' per "
            "entry without whitespace, quotes or backslashes (e.g. '--log-style=record'); "
            "options the launcher sets (--num-cpus, --port, ...) are refused."
        ),
    )
    pre_start_commands: list[str] = Field(
        default_factory=list,
        description=(
            "Shell lines run on every node before its 'ray start' (e.g. 'module load "
            "cuda/12.2'), verbatim and in order, without stopping at a failing line (write "
            "'|| exit 1' to stop). An 'exit' ends that node, which fails the job."
        ),
    )
    redis_password: str | None = Field(
        default=None,
        description=(
            "Passed to every node's 'ray start --redis-password'. It reaches the nodes in "
            "the environment, not on srun's or bash's command line; Ray 2.60 takes it only "
            "as that option and passes it on to its own processes (gcs_server, workers) as "
            "arguments, so it is visible in process listings on the job's nodes."
        ),
    )
    object_store_memory: int | None = Field(
        default=None,
        description=(
            "Object store size per node in bytes. None: 30% of the memory Slurm granted on "
            "the node (Ray's own default sizes it from the whole machine); Ray's default in "
            "local mode."
        ),
    )
    include_dashboard: bool = Field(
        default=True, description="Start the Ray dashboard on the head."
    )
    dashboard_host: str | None = Field(
        default=None,
        description=(
            "Address the dashboard listens on. None: the head node's own address (the one "
            "Ray uses), so that it is not offered on every interface of a shared node; "
            "'0.0.0.0' listens on all interfaces."
        ),
    )
    startup_timeout: float = Field(
        default=120.0,
        description=(
            "Seconds from the start of the script's Ray part until the head answers and "
            "every node has joined; the job fails after that, naming the missing nodes."
        ),
    )
    temp_dir: str | None = Field(
        default=None,
        description=(
            f"Ray's temp dir on every node (at most {TEMP_DIR_MAX} bytes: Ray puts Unix "
            "sockets below it). None: /tmp/dsray-<job id>-<node index>, removed afterwards."
        ),
    )

    @classmethod
    def move_published_values(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``ray_start_args=["--include-dashboard=false"]`` moved to ``include_dashboard``
        before Dagster records the configuration (see :class:`PublishedNames`)."""
        return dict(move_include_dashboard(data))

    @model_validator(mode="before")
    @classmethod
    def _published_dashboard_option(cls, data: Any) -> Any:
        return move_include_dashboard(data)  # also when built from a mapping (run config)

    @field_validator("num_cpus_per_node")
    @classmethod
    def _check_cpus(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"num_cpus_per_node={value!r}: must be at least 1 (or None)")
        return value

    @field_validator("num_gpus_per_node")
    @classmethod
    def _check_gpus(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"num_gpus_per_node={value!r}: must not be negative")
        return value

    @field_validator("ray_port", "dashboard_port")
    @classmethod
    def _check_port(cls, value: int | None, info: Any) -> int | None:
        if value is not None and not LOWEST_PORT <= value <= HIGHEST_PORT:
            raise ValueError(
                f"{info.field_name}={value!r}: must be a port between {LOWEST_PORT} and "
                f"{HIGHEST_PORT}"
            )
        return value

    @field_validator("working_dir", "redis_password")
    @classmethod
    def _check_text(cls, value: str | None, info: Any) -> str | None:
        if value is not None and (not value or has_control_characters(value)):
            raise ValueError(
                f"{info.field_name}={value!r}: must be non-empty, without control characters"
            )
        return value

    @field_validator("network_interface")
    @classmethod
    def _check_interface(cls, value: str | None) -> str | None:
        if value is not None and NETWORK_INTERFACE.fullmatch(value) is None:
            raise ValueError(f"network_interface={value!r}: not a network interface name")
        return value

    @field_validator("head_node_address", "dashboard_host")
    @classmethod
    def _check_address(cls, value: str | None, info: Any) -> str | None:
        if value is not None and HOST_ADDRESS.fullmatch(value) is None:
            raise ValueError(f"{info.field_name}={value!r}: not a host name or IP address")
        return value

    @field_validator("node_ip_address_command")
    @classmethod
    def _check_command(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\0" in value):
            raise ValueError(
                f"node_ip_address_command={value!r}: must be a non-empty command without NUL"
            )
        return value

    @field_validator("ray_start_args")
    @classmethod
    def _check_start_args(cls, value: list[str]) -> list[str]:
        checked = validate_option_entries(value, field="ray_start_args", rules=RAY_START_RULES)
        for index, entry in enumerate(checked):  # each is one argument of `ray start`
            check_argument(f"ray_start_args[{index}]", entry)
        return list(checked)

    @field_validator("pre_start_commands")
    @classmethod
    def _check_lines(cls, value: list[str], info: Any) -> list[str]:
        for index, item in enumerate(value):
            if "\0" in item:
                raise ValueError(f"{info.field_name}[{index}]={item!r}: contains a NUL character")
        return value

    @field_validator("object_store_memory")
    @classmethod
    def _check_store(cls, value: int | None) -> int | None:
        if value is not None and value < MIN_OBJECT_STORE_MEMORY:
            raise ValueError(
                f"object_store_memory={value!r}: Ray needs at least {MIN_OBJECT_STORE_MEMORY} "
                "bytes (75 MiB)"
            )
        return value

    @field_validator("startup_timeout")
    @classmethod
    def _check_timeout(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"startup_timeout={value!r}: must be a positive number of seconds")
        return value

    @field_validator("temp_dir")
    @classmethod
    def _check_temp_dir(cls, value: str | None) -> str | None:
        return None if value is None else check_temp_dir(value)

    @model_validator(mode="after")
    def _check_fixed_ports(self) -> RayLauncher:
        if (
            self.ray_port is not None
            and self.ray_port == self.dashboard_port
            and self.include_dashboard
        ):
            raise ValueError(f"dashboard_port={self.dashboard_port!r}: same as ray_port")
        if self.port_strategy != "fixed":
            return self
        base = self.port_config.range_start
        block = range(base, base + self.port_config.block_size)
        for name, own in (("ray_port", "gcs"), ("dashboard_port", "dashboard")):
            value = getattr(self, name)
            if value in block and value != base + PORT_OFFSETS[own]:
                raise ValueError(
                    f"{name}={value!r}: collides with another port of the head's block "
                    f"{block.start}-{block.stop - 1} (port_strategy 'fixed'); choose a port "
                    "outside it"
                )
        return self

    def render(self, plan: ExecutionPlan) -> str:
        """The job script: the common prologue, the Ray cluster, the payload, the teardown."""
        return render_template(
            RAY_TEMPLATE,
            {
                "startup_timeout": str(math.ceil(self.startup_timeout)),
                "stop_grace": str(RAY_STOP_GRACE_SECONDS),
                "head_node_address": self.head_node_address or "",
                "working_dir": self.working_dir or "",
                "failed_status": str(RAY_START_FAILED_STATUS),
                "dashboard_line": RAY_DASHBOARD_FORMAT,
                "tunnel_line": RAY_TUNNEL_FORMAT,
                "redis_password": self.redis_password or "",
            },
            {
                "prologue": render_prologue(plan, launcher="ray"),
                "ports": self.port_functions(),
                "node": self.node_functions(plan.mode),
            },
        )

    def port_functions(self) -> str:
        """The shell functions and settings that pick a node's port block (bash text)."""
        return port_block_functions(
            self.port_strategy, self.port_config,
            ray_port=self.ray_port, dashboard_port=self.dashboard_port,
        )

    def node_functions(self, mode: str) -> str:
        """The shell functions and settings that start one Ray node (bash text)."""
        return render_template(
            RAY_NODE_TEMPLATE,
            {
                "mode": mode,
                "num_cpus": optional_word(self.num_cpus_per_node),
                "num_gpus": str(self.num_gpus_per_node),
                "object_store_memory": optional_word(self.object_store_memory),
                "include_dashboard": "1" if self.include_dashboard else "",
                "dashboard_host": self.dashboard_host or "",
                "temp_dir": self.temp_dir or "",
                "temp_dir_max": str(TEMP_DIR_MAX),
                "network_interface": self.network_interface or "",
                "node_ip_address_command": self.node_ip_address_command or "",
                "pre_start": "\n".join(self.pre_start_commands),
                "ray_start_args": list(self.ray_start_args),
            },
        )
