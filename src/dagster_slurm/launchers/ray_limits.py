"""What Ray and the launcher allow in :class:`~dagster_slurm.launchers.ray.RayLauncher`'s settings.

* the ``ray start`` options the launcher passes itself (:data:`RAY_MANAGED_OPTIONS`, each
  with what to configure instead), refused in ``ray_start_args`` by :data:`RAY_START_RULES`;
* the longest Ray temp dir (:data:`TEMP_DIR_MAX`: Ray creates Unix sockets below it);
* the smallest object store Ray accepts (:data:`MIN_OBJECT_STORE_MEMORY`);
* what a network interface name and a host address may look like, and that the text
  settings carry no control characters.
"""

from __future__ import annotations

import re

from dagster_slurm.slurm.directives import OptionRules

UNIX_SOCKET_PATH_MAX = 107
"""Longest Unix socket path Linux accepts (108 bytes with the terminating NUL)."""

RAY_SOCKET_SUFFIX = len("/session_2025-01-01_00-00-00_000000_4194304/sockets/plasma_store.1")
"""Longest part Ray appends to its temp dir for a socket path (session dir, socket name)."""

TEMP_DIR_MAX = UNIX_SOCKET_PATH_MAX - RAY_SOCKET_SUFFIX
"""Longest Ray temp dir whose socket paths still fit (41 bytes)."""

MIN_OBJECT_STORE_MEMORY = 78_643_200
"""Smallest object store Ray accepts (75 MiB)."""

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

NETWORK_INTERFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
"""A network interface name (Linux allows at most 15 bytes)."""

HOST_ADDRESS = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,253}")
"""A host name or an IP address (an IPv6 address with or without brackets)."""


def has_control_characters(text: str) -> bool:
    """Whether ``text`` holds an ASCII control character (below 32, or DEL)."""
    return any(ord(char) < 32 or ord(char) == 127 for char in text)


def check_temp_dir(value: str) -> str:
    """``value`` as Ray's temp dir, without a trailing slash; ``ValueError`` unless it is an
    absolute path without control characters and at most :data:`TEMP_DIR_MAX` bytes long
    (Ray creates Unix sockets below it)."""
    if not value.startswith("/") or has_control_characters(value):
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
