"""Rendering of the cluster's configuration files from the templates in package data.

Templates use :class:`string.Template` placeholders (``${name}``); a missing value is an
error, never a silently empty field. :func:`render_all` returns every file as text, and
:func:`write_if_changed` writes a file only when its content differs, so that an
unchanged configuration leaves running daemons alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from dagster_slurm.devcluster.layout import (
    CLUSTER_NAME,
    CPU_PARTITION,
    CPUS_PER_NODE,
    DEF_MEM_PER_CPU_MB,
    GPU_PARTITION,
    LOGIN_ADDRESS,
    LOGIN_NODE,
    LOOPBACK,
    NODES,
    PARTITION_MAX_TIME,
    REAL_MEMORY_MB,
    Node,
    Settings,
)

_PACKAGE = "dagster_slurm.devcluster"


def render_template(name: str, values: dict[str, object]) -> str:
    """Fill the template file ``name`` from package data with ``values``.

    Raises :class:`KeyError` when the template uses a placeholder that ``values`` lacks.
    """
    source = resources.files(_PACKAGE).joinpath("templates").joinpath(name)
    text = source.read_text(encoding="utf-8")
    return Template(text).substitute({k: str(v) for k, v in values.items()})


@dataclass(frozen=True)
class RenderedFile:
    """One configuration file: where it goes, its text and its permission bits."""

    path: Path
    text: str
    mode: int = 0o644


def _node_line(settings: Settings, node: Node) -> str:
    gres = f" Gres=gpu:{node.gpus}" if node.gpus else ""
    return render_template(
        "slurm-node.line",
        {
            "name": node.name,
            "address": node.address,
            "port": settings.node_port(node),
            "cpus": CPUS_PER_NODE,
            "memory": REAL_MEMORY_MB,
            "gres": gres,
        },
    ).rstrip("\n")


def _names(partition: str) -> str:
    return ",".join(n.name for n in NODES if n.partition == partition)


def gpu_device_paths(settings: Settings) -> list[Path]:
    """Character devices standing in for GPUs (shared by all GPU nodes, as /dev/nvidiaN)."""
    count = max(n.gpus for n in NODES)
    return [settings.paths.devices / f"nvidia{i}" for i in range(count)]


def render_slurm_conf(settings: Settings) -> str:
    """Text of slurm.conf: controller, accounting, nodes c1,c2 (cpu) and g1,g2 (gpu)."""
    paths = settings.paths
    return render_template(
        "slurm.conf",
        {
            "cluster_name": CLUSTER_NAME,
            "loopback": LOOPBACK,
            "slurmctld_port": settings.port("slurmctld"),
            "slurmdbd_port": settings.port("slurmdbd"),
            "munge_socket": paths.munge_socket,
            "ctld_state": paths.ctld_state,
            "spool": paths.spool,
            "run": paths.run,
            "log": paths.log,
            "def_mem_per_cpu": DEF_MEM_PER_CPU_MB,
            "node_lines": "\n".join(_node_line(settings, n) for n in NODES),
            "cpu_partition": CPU_PARTITION,
            "gpu_partition": GPU_PARTITION,
            "cpu_nodes": _names(CPU_PARTITION),
            "gpu_nodes": _names(GPU_PARTITION),
            "max_time": PARTITION_MAX_TIME,
        },
    )


def render_gres_conf(settings: Settings) -> str:
    """Text of gres.conf: each GPU node offers the fake devices as ``gpu`` GRES."""
    devices = gpu_device_paths(settings)
    files = f"{settings.paths.devices}/nvidia[0-{len(devices) - 1}]"
    gpu_nodes = ",".join(n.name for n in NODES if n.gpus)
    return render_template("gres.conf", {"gpu_nodes": gpu_nodes, "gpu_files": files})


def render_slurmdbd_conf(settings: Settings, db_password: str) -> str:
    """Text of slurmdbd.conf; it holds the database password, so it is written mode 600."""
    paths = settings.paths
    return render_template(
        "slurmdbd.conf",
        {
            "munge_socket": paths.munge_socket,
            "loopback": LOOPBACK,
            "slurmdbd_port": settings.port("slurmdbd"),
            "log": paths.log,
            "run": paths.run,
            "mariadb_port": settings.port("mariadb"),
            "db_password": db_password,
        },
    )


def render_node_hosts(extra_lines: Sequence[str] = ()) -> str:
    """Text of the hosts file mounted over /etc/hosts inside every node's namespace
    (``extra_lines``: those of further login nodes)."""
    lines = "\n".join(
        [f"{n.address} {n.name}" for n in NODES] + [f"{LOGIN_ADDRESS} {LOGIN_NODE}"]
        + list(extra_lines)
    )
    return render_template("hosts", {"node_lines": lines})


def render_sshd_config(
    settings: Settings,
    *,
    listen: str | None = None,
    port: int | None = None,
    pid_file: str | Path | None = None,
) -> str:
    """Text of the login node's sshd_config (loopback only, key login of the submitter);
    ``listen``, ``port`` and ``pid_file`` replace the login node's for another one."""
    paths = settings.paths
    return render_template(
        "sshd_config",
        {
            "port": port if port is not None else settings.ssh_port,
            "listen": listen if listen is not None else settings.ssh_listen,
            "host_key": paths.host_key,
            "pid_file": pid_file if pid_file is not None else paths.pid_file("sshd"),
            "user": settings.user,
            "slurm_conf": paths.slurm_conf,
        },
    )


def render_grants(db_password: str) -> str:
    """SQL that creates (or updates) the database account slurmdbd uses."""
    return render_template("grants.sql", {"db_password": db_password})


def render_all(
    settings: Settings, db_password: str, login_host_lines: Sequence[str] = ()
) -> list[RenderedFile]:
    """Every configuration file of the cluster with its target path and mode
    (``login_host_lines``: hosts lines of further login nodes)."""
    paths = settings.paths
    return [
        RenderedFile(paths.slurm_conf, render_slurm_conf(settings)),
        RenderedFile(paths.gres_conf, render_gres_conf(settings)),
        RenderedFile(paths.slurmdbd_conf, render_slurmdbd_conf(settings, db_password), 0o600),
        RenderedFile(paths.node_hosts, render_node_hosts(login_host_lines)),
        RenderedFile(paths.sshd_config, render_sshd_config(settings)),
    ]


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` atomically unless it already holds exactly that text.

    Returns True when the file was (re)written. The mode is applied in both cases.
    """
    try:
        unchanged = path.read_text(encoding="utf-8") == text
    except OSError:
        unchanged = False
    if not unchanged:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    os.chmod(path, mode)
    return not unchanged
