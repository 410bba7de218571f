"""Which ports a Ray node binds, and how a node picks them (pure code).

A Ray node binds about ten fixed ports plus one port per worker process. Several Ray
clusters routinely share a compute node (two assets, two users), and Ray's default ports
would collide, so every node takes a *block* of consecutive ports from a range shared by
all jobs, and derives each of its ports from the block's first port (its *base*) with the
offsets in :data:`PORT_OFFSETS`:

======================  ======  ====================================================
port                    offset  ``ray start`` option
======================  ======  ====================================================
GCS (head only)         0       ``--port``
node manager            1       ``--node-manager-port``
object manager          2       ``--object-manager-port``
dashboard (head only)   3       ``--dashboard-port``
dashboard agent (HTTP)  4       ``--dashboard-agent-listen-port``
dashboard agent (gRPC)  5       ``--dashboard-agent-grpc-port``
metrics export          6       ``--metrics-export-port``
runtime env agent       7       ``--runtime-env-agent-port``
Ray client              8       ``--ray-client-server-port``
workers                 10..    ``--min-worker-port`` .. ``--max-worker-port`` (rest of the block)
======================  ======  ====================================================

The job script does the picking at run time, on each node (``templates/ray_ports.sh``,
rendered by :func:`port_block_functions`); this module holds the same rules in Python so
that they are validated before submission and unit-tested:

* ``random``: start at a random block, try blocks in order (wrapping around) until one can
  be locked with ``flock`` and has no listening socket; see :func:`candidate_blocks` and
  :func:`choose_block`.
* ``hash_jobid``: the block given by :func:`hash_block_index` of the job id plus the
  node's index; no lock, no check. Also the fallback of ``random`` where ``flock`` is missing.
* ``fixed``: node ``i`` uses block ``i`` of the range (wrapping around); the head's GCS and
  dashboard ports may be set explicitly.

Ports the kernel assigns itself (a few of the dashboard's subprocesses bind port 0)
come from the ephemeral range (32768-60999 on Linux) and cannot collide with a block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from dagster import Config
from pydantic import ConfigDict, Field, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.launchers.script import optional_word, render_template

PortStrategy = Literal["random", "hash_jobid", "fixed"]
"""How a Ray node picks its port block (see the module docstring)."""

PORT_STRATEGIES: tuple[str, ...] = ("random", "hash_jobid", "fixed")

LOWEST_PORT = 1024
"""Lowest port a range may use (lower ones need privileges)."""
HIGHEST_PORT = 65535

PORT_OFFSETS: Mapping[str, int] = MappingProxyType(
    {
        "gcs": 0,
        "node_manager": 1,
        "object_manager": 2,
        "dashboard": 3,
        "dashboard_agent_listen": 4,
        "dashboard_agent_grpc": 5,
        "metrics_export": 6,
        "runtime_env_agent": 7,
        "client_server": 8,
    }
)
"""Offset of each fixed port from the block's base."""

RAY_PORTS_TEMPLATE = "ray_ports.sh"
"""Port block selection, run on every Ray node."""

FIRST_WORKER_OFFSET = 10
"""Worker ports run from ``base + FIRST_WORKER_OFFSET`` to the block's last port."""

MIN_WORKER_PORTS = 54
"""Fewest worker ports a block must leave (one per worker process, drivers included)."""

MIN_BLOCK_SIZE = FIRST_WORKER_OFFSET + MIN_WORKER_PORTS
"""Smallest accepted ``block_size`` (64)."""

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


class RayPortConfig(Config, KnownFieldsOnly):
    """The port range Ray nodes take their blocks from, and the block size.

    Use one range and one block size for the whole cluster, restricted to ports that
    compute nodes may open to each other, so that blocks of different jobs line up and
    the locks of different users mean the same ports.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    range_start: int = Field(
        default=10000, description="First port of the range blocks are taken from."
    )
    range_end: int = Field(default=29999, description="Last port of the range (inclusive).")
    block_size: int = Field(
        default=1000,
        description=(
            f"Ports per Ray node; at least {MIN_BLOCK_SIZE}. All but the first "
            f"{FIRST_WORKER_OFFSET} are worker ports, which bounds the worker processes "
            "a node can run at once."
        ),
    )
    lock_dir: str = Field(
        default="/tmp",
        description=(
            "Node-local directory shared by all jobs on a node (world-writable, like /tmp) "
            "that holds the lock files of the blocks (strategy 'random')."
        ),
    )

    @model_validator(mode="after")
    def _check_range(self) -> RayPortConfig:
        for name in ("range_start", "range_end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not LOWEST_PORT <= value <= HIGHEST_PORT:
                raise ValueError(
                    f"port_config.{name}={value!r}: must be a port between "
                    f"{LOWEST_PORT} and {HIGHEST_PORT}"
                )
        if self.range_start >= self.range_end:
            raise ValueError(
                f"port_config.range_start={self.range_start!r}: must be below "
                f"range_end={self.range_end!r}"
            )
        if self.block_size < MIN_BLOCK_SIZE:
            raise ValueError(
                f"port_config.block_size={self.block_size!r}: a Ray node needs "
                f"{FIRST_WORKER_OFFSET} fixed ports and at least {MIN_WORKER_PORTS} worker "
                f"ports; use at least {MIN_BLOCK_SIZE}"
            )
        if self.block_size > self.range_end - self.range_start + 1:
            raise ValueError(
                f"port_config.block_size={self.block_size!r}: larger than the range "
                f"{self.range_start}-{self.range_end}"
            )
        lock_dir = self.lock_dir
        if not lock_dir.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in lock_dir):
            raise ValueError(
                f"port_config.lock_dir={lock_dir!r}: must be an absolute path without "
                "control characters"
            )
        return self

    @property
    def block_count(self) -> int:
        """How many whole blocks fit in the range."""
        return block_count(self.range_start, self.range_end, self.block_size)

    def block_base(self, index: int) -> int:
        """First port of block ``index`` (taken modulo :attr:`block_count`)."""
        return self.range_start + (index % self.block_count) * self.block_size


@dataclass(frozen=True)
class RayNodePorts:
    """Every port of one Ray node, derived from its block."""

    base: int
    block_size: int

    def port(self, name: str) -> int:
        """The port called ``name`` in :data:`PORT_OFFSETS`."""
        return self.base + PORT_OFFSETS[name]

    @property
    def min_worker_port(self) -> int:
        return self.base + FIRST_WORKER_OFFSET

    @property
    def max_worker_port(self) -> int:
        return self.base + self.block_size - 1

    def all_ports(self) -> range:
        """The whole block."""
        return range(self.base, self.base + self.block_size)


def block_count(range_start: int, range_end: int, block_size: int) -> int:
    """Whole blocks of ``block_size`` ports in ``range_start..range_end`` (inclusive)."""
    return (range_end - range_start + 1) // block_size


def fnv1a_32(text: str) -> int:
    """32-bit FNV-1a of the UTF-8 bytes of ``text``; the job script computes the same."""
    value = _FNV_OFFSET
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return value


def hash_block_index(job_id: str, node_index: int, blocks: int) -> int:
    """Block of node ``node_index`` of job ``job_id`` under ``hash_jobid``.

    ``(fnv1a_32(job_id) + node_index) % blocks``: the nodes of one job take consecutive
    blocks, so they never collide with each other even when they share a host (test
    setups); different jobs collide when their hashes land close together.
    """
    if blocks < 1:
        raise ValueError(f"blocks={blocks!r}: must be at least 1")
    return (fnv1a_32(job_id) + node_index) % blocks


def candidate_blocks(first: int, blocks: int) -> Iterator[int]:
    """Order in which ``random`` tries blocks: ``first``, ``first + 1``, ... wrapping around."""
    for step in range(blocks):
        yield (first + step) % blocks


def choose_block(
    config: RayPortConfig,
    first: int,
    is_free: Callable[[int], bool],
) -> int | None:
    """Base port of the first block, from block ``first`` on, that ``is_free`` accepts.

    ``is_free(base)`` stands for "the lock could be taken and nothing listens in the
    block". None when every block of the range is taken.
    """
    for index in candidate_blocks(first, config.block_count):
        base = config.block_base(index)
        if is_free(base):
            return base
    return None


def fixed_block_base(config: RayPortConfig, node_index: int) -> int:
    """Base port of node ``node_index`` under ``fixed``: block ``node_index`` of the range."""
    return config.block_base(node_index)


def reserved_offsets() -> frozenset[int]:
    """Offsets of the fixed ports (the ones that are not worker ports)."""
    return frozenset(PORT_OFFSETS.values())


SCRIPT_PORT_ORDER: tuple[str, ...] = (*PORT_OFFSETS, "min_worker")
"""Order of the offsets handed to the script (``__ds_ray_port`` in ``ray_ports.sh``)."""


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
            "ray_port": optional_word(ray_port),
            "dashboard_port": optional_word(dashboard_port),
            "offsets": offsets,
        },
    )
