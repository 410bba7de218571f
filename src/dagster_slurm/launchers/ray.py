"""The Ray launcher: a Ray cluster for the payload, started by the job script itself.

In ``slurm`` mode the job script (running on the allocation's first node) starts one Ray
node per host of the allocation, each inside an ``srun --overlap`` step: the head on its
own host, then, once the head's GCS answers, a worker on every other host. Each node works
out its own address and ports on its host; the workers get the head's *address*, so host
names never have to resolve between nodes. When every node has joined, the payload runs on
the head's host with ``RAY_ADDRESS`` set (``ray.init(address="auto")`` connects), under
the same signal and exit-status contract as with :class:`~dagster_slurm.launchers.BashLauncher`.
Afterwards, and on a failed start, every node is stopped, the workers before the head:
its shell (told through ``scancel --signal=URG`` on its step, a signal Ray's processes
ignore) sends SIGTERM to its ``ray start`` alone, which shuts the node down in order; the
script waits up to :data:`RAY_STOP_GRACE_SECONDS`, then ends the step. Never ``ray stop``:
it would stop every Ray cluster of the host. After a cancellation or drain the nodes are
asked to stop without waiting, so that the status file is written before Slurm kills what
is left; ``ray start --block`` keeps all Ray processes inside the steps, where Slurm's
process tracking finds them (their temp dirs may then stay behind).

In ``local`` mode the same script starts one Ray node on this machine (address 127.0.0.1
unless configured) and stops it the same way.

Script contract, beyond the common one (``templates/job_common.sh``):

* exit status :data:`RAY_START_FAILED_STATUS` when the cluster does not come up: a node's
  step ended early, or not all nodes joined within ``startup_timeout``; the last lines of
  the job's stderr name the nodes and show their last output lines (Ray's own log tails
  included);
* stdout gets ``Ray head node web UI: http://<address>:<port>`` and an ``ssh -L`` hint;
* exit status 125 when ``working_dir`` cannot be entered;
* each node's output goes to ``ray-node-<index>.log`` in the job directory and, prefixed
  with ``[ray <host>]``, to the job's stderr;
* the ``ray`` command must be on ``PATH`` after activation, on every node.

Ports: see :mod:`dagster_slurm.launchers.ray_ports`.
"""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from dagster_slurm.config_errors import PublishedNames, RenamedField
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.launchers.ray_ports import (
    FIRST_WORKER_OFFSET,
    HIGHEST_PORT,
    LOWEST_PORT,
    PORT_OFFSETS,
    PortStrategy,
    RayPortConfig,
)
from dagster_slurm.launchers.script import render_prologue, render_template
from dagster_slurm.slurm.directives import OptionRules, validate_option_entries

RAY_TEMPLATE = "ray_launcher.sh"
"""The Ray launcher's part of the job script (after the common prologue)."""
RAY_NODE_TEMPLATE = "ray_node.sh"
"""Functions that run on every Ray node."""
RAY_PORTS_TEMPLATE = "ray_ports.sh"
"""Port block selection, run on every Ray node."""

RAY_START_FAILED_STATUS = 123
"""Exit status of a job whose Ray cluster did not come up."""

RAY_STOP_GRACE_SECONDS = 15
"""How long the script waits for Ray nodes to stop after SIGTERM before killing them."""

UNIX_SOCKET_PATH_MAX = 107
"""Longest Unix socket path Linux accepts (108 bytes with the terminating NUL)."""

RAY_SOCKET_SUFFIX = len("/session_2025-01-01_00-00-00_000000_4194304/sockets/plasma_store.1")
"""Longest part Ray appends to its temp dir for a socket path (session dir, socket name)."""

TEMP_DIR_MAX = UNIX_SOCKET_PATH_MAX - RAY_SOCKET_SUFFIX
"""Longest Ray temp dir whose socket paths still fit (41 bytes)."""

MIN_OBJECT_STORE_MEMORY = 78_643_200
"""Smallest object store Ray accepts (75 MiB)."""

RAY_DASHBOARD_PREFIX = "Ray head node web UI:"
"""Start of the job script's stdout line with the Ray dashboard's URL."""

RAY_TUNNEL_PREFIX = "To reach it from your machine:"
"""Start of the job script's stdout line with the ``ssh -L`` command that reaches the
dashboard from outside the cluster (slurm mode only)."""

RAY_NOTABLE_PREFIXES = (RAY_DASHBOARD_PREFIX, RAY_TUNNEL_PREFIX)
"""Starts of the launcher's stdout lines that also belong in the Dagster log. The only
definition of these lines: the script prints them from :data:`RAY_DASHBOARD_FORMAT` and
:data:`RAY_TUNNEL_FORMAT`, and :mod:`dagster_slurm.jobs.logs` picks them out of the output."""

RAY_DASHBOARD_FORMAT = RAY_DASHBOARD_PREFIX + " http://%s:%s\\n"
"""``printf`` format of the dashboard line (arguments: head address, dashboard port)."""

RAY_TUNNEL_FORMAT = RAY_TUNNEL_PREFIX + " ssh -L 8265:%s:%s <login-host>, then open %s\\n"
"""``printf`` format of the tunnel line (arguments: head address, dashboard port, local URL)."""

SCRIPT_PORT_ORDER: tuple[str, ...] = (*PORT_OFFSETS, "min_worker")
"""Order of the offsets handed to the script (``__ds_ray_port`` in ``ray_ports.sh``)."""

_SET_BY_LAUNCHER = "is set by the launcher on every node"
_FROM_BLOCK = "is taken from the node's port block; configure port_config instead"
_USE = "is set by the launcher; use "

#: ``ray start`` options the launcher passes itself, with what to use instead.
RAY_MANAGED_OPTIONS: dict[str, str] = {
    "num-cpus": _USE + "num_cpus_per_node",
    "num-gpus": _USE + "num_gpus_per_node",
    "object-store-memory": _USE + "object_store_memory",
    "redis-password": _USE + "redis_password",
    "temp-dir": _USE + "temp_dir",
    "node-ip-address": _USE + "network_interface or node_ip_address_command",
    "address": _USE + "head_node_address (workers join the head the job starts)",
    "port": _USE + "ray_port",
    "dashboard-port": _USE + "dashboard_port",
    "include-dashboard": _USE + "include_dashboard",
    "dashboard-host": _SET_BY_LAUNCHER,
    "head": _SET_BY_LAUNCHER + " (the first node is the head)",
    "block": _SET_BY_LAUNCHER + " (it keeps Ray inside the job step)",
    "resources": _SET_BY_LAUNCHER + " (it marks the head and the workers)",
    "disable-usage-stats": _SET_BY_LAUNCHER,
    "log-color": _SET_BY_LAUNCHER,
    "node-manager-port": _FROM_BLOCK,
    "object-manager-port": _FROM_BLOCK,
    "dashboard-agent-listen-port": _FROM_BLOCK,
    "dashboard-agent-grpc-port": _FROM_BLOCK,
    "metrics-export-port": _FROM_BLOCK,
    "runtime-env-agent-port": _FROM_BLOCK,
    "ray-client-server-port": _FROM_BLOCK,
    "min-worker-port": _FROM_BLOCK,
    "max-worker-port": _FROM_BLOCK,
}


def _ray_reserved(name: str) -> str | None:
    advice = RAY_MANAGED_OPTIONS.get(name)
    return None if advice is None else f"--{name} {advice}"


RAY_START_RULES = OptionRules(
    program="ray start",
    reserved=_ray_reserved,
    short_form=lambda entry: (
        "only long-form options are accepted, one per entry, e.g. '--log-style=record'"
    ),
    example="--log-style=record",
)
"""What ``ray_start_args`` may hold: the rules of extra sbatch options (one long-form
option per entry, no whitespace, quotes or backslashes, each option once), with the options
the launcher passes itself refused instead of sbatch's."""

_INTERFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
_ADDRESS = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,253}")


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


def _has_control(text: str) -> bool:
    return any(ord(char) < 32 or ord(char) == 127 for char in text)


class RayLauncher(PublishedNames, ComputeLauncher):
    """Starts a Ray cluster inside the job, runs the payload on its head, then stops it.

    ``slurm`` mode: one Ray node per host of the allocation (the head on the first); local
    mode: one Ray node on this machine. The payload finds the cluster through
    ``RAY_ADDRESS``. See the module documentation for the script's behaviour.

    The published package's ``object_store_memory_gb=`` (gigabytes of 10**9 bytes) and
    ``head_startup_timeout=`` are accepted for ``object_store_memory`` (bytes) and
    ``startup_timeout``, with a deprecation warning.
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
        if value is not None and (not value or _has_control(value)):
            raise ValueError(
                f"{info.field_name}={value!r}: must be non-empty, without control characters"
            )
        return value

    @field_validator("network_interface")
    @classmethod
    def _check_interface(cls, value: str | None) -> str | None:
        if value is not None and _INTERFACE.fullmatch(value) is None:
            raise ValueError(f"network_interface={value!r}: not a network interface name")
        return value

    @field_validator("head_node_address", "dashboard_host")
    @classmethod
    def _check_address(cls, value: str | None, info: Any) -> str | None:
        if value is not None and _ADDRESS.fullmatch(value) is None:
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
        return list(validate_option_entries(value, field="ray_start_args", rules=RAY_START_RULES))

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
        if value is None:
            return value
        if not value.startswith("/") or _has_control(value):
            raise ValueError(
                f"temp_dir={value!r}: must be an absolute path without control characters"
            )
        size = len(value.rstrip("/").encode("utf-8"))
        if size > TEMP_DIR_MAX:
            raise ValueError(
                f"temp_dir={value!r}: {size} bytes is too long; Ray creates Unix sockets "
                f"below it and their paths are limited to {UNIX_SOCKET_PATH_MAX} bytes, so "
                f"use at most {TEMP_DIR_MAX} bytes (e.g. /tmp/ray-<name>)"
            )
        return value.rstrip("/") or "/"

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
                "num_cpus": _optional(self.num_cpus_per_node),
                "num_gpus": str(self.num_gpus_per_node),
                "object_store_memory": _optional(self.object_store_memory),
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


def _optional(value: int | None) -> str:
    return "" if value is None else str(value)


def port_block_functions(
    strategy: str, config: RayPortConfig, *, ray_port: int | None = None,
    dashboard_port: int | None = None,
) -> str:
    """The shell functions and settings of ``templates/ray_ports.sh`` that pick a port
    block on a node (``__ds_ray_choose_block``), for Ray nodes and the other launchers
    that take blocks from the same range and lock files. They log through
    ``__ds_ray_node_log``, which the including script defines."""
    offsets = [
        str(FIRST_WORKER_OFFSET if name == "min_worker" else PORT_OFFSETS[name])
        for name in SCRIPT_PORT_ORDER
    ]
    return render_template(
        RAY_PORTS_TEMPLATE,
        {
            "strategy": strategy,
            "range_start": str(config.range_start),
            "range_end": str(config.range_end),
            "block_size": str(config.block_size),
            "lock_dir": config.lock_dir,
            "ray_port": _optional(ray_port),
            "dashboard_port": _optional(dashboard_port),
            "offsets": offsets,
        },
    )
