"""Several login nodes behind one name: ``up --login-nodes N`` (N >= 2).

A site often puts several login nodes behind one DNS name; each is a machine of its own
(hostname, ``/tmp``, process table) and all share ``/home``. With ``login_nodes`` of 2 or
more the dev cluster runs, instead of the one login node ``login`` (daemon ``sshd``):

``sshd-login1``, ``sshd-login2``, ...
    One sshd per login node, each in its own UTS, mount and PID namespace (hostname
    ``loginN``, its own ``/tmp``, pids that mean nothing on the other nodes), listening on
    the node's own address (127.0.1.101, ...) at port SSH port + 10 + N. They share the
    submitter's home, the cluster's state directory and the host key, as the nodes behind a
    site's alias do.
``login-alias``
    The SSH port itself (``settings.ssh_host:ssh_port``): a small forwarder
    (:mod:`dagster_slurm.devcluster.alias`) that sends each new connection to the next
    login node in turn, like a DNS name with one address per node. Every connection the
    library opens may land on another node.

With one login node (the default) nothing here runs and nothing else changes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dagster_slurm.devcluster import alias
from dagster_slurm.devcluster.config import RenderedFile, render_sshd_config
from dagster_slurm.devcluster.daemons import DaemonSpec, executable, in_node_namespace
from dagster_slurm.devcluster.layout import MAX_LOGIN_NODES, Settings
from dagster_slurm.devcluster.processes import ssh_banner

#: Name of the round-robin forwarder in the pid records, ``status`` and its log file.
ALIAS_DAEMON = "login-alias"
#: Port of login node N: the SSH port plus this plus N.
NODE_PORT_OFFSET = 10


@dataclass(frozen=True)
class LoginNode:
    """Login node ``name`` (``login1`` ...; also its hostname) at ``address``:``port``."""

    name: str
    address: str
    port: int

    @property
    def daemon(self) -> str:
        """Name of the node's sshd in the pid records and ``status``."""
        return f"sshd-{self.name}"


def login_nodes(settings: Settings) -> tuple[LoginNode, ...]:
    """The login nodes behind the SSH port; empty with one login node (``login`` itself)."""
    if settings.login_nodes < 2:
        return ()
    return tuple(
        LoginNode(f"login{i}", f"127.0.1.{100 + i}", settings.ssh_port + NODE_PORT_OFFSET + i)
        for i in range(1, settings.login_nodes + 1)
    )


def all_node_daemons() -> list[str]:
    """Every login node daemon ``up`` may start, whatever the count (for ``status``/``down``)."""
    return [f"sshd-login{i}" for i in range(1, MAX_LOGIN_NODES + 1)] + [ALIAS_DAEMON]


def chosen_daemons(settings: Settings) -> list[str]:
    """The daemons that serve the SSH port with these settings."""
    nodes = login_nodes(settings)
    return [*(node.daemon for node in nodes), ALIAS_DAEMON] if nodes else ["sshd"]


def config_path(settings: Settings, node: LoginNode) -> Path:
    return settings.paths.etc / f"sshd_config.{node.name}"


def render_files(settings: Settings) -> list[RenderedFile]:
    """One sshd_config per login node (the login node's template, the node's address)."""
    return [
        RenderedFile(
            config_path(settings, node),
            render_sshd_config(settings, listen=node.address, port=node.port, pid_file="none"),
        )
        for node in login_nodes(settings)
    ]


def host_lines(settings: Settings) -> list[str]:
    """``/etc/hosts`` lines of the login nodes (none with one login node)."""
    return [f"{node.address} {node.name}" for node in login_nodes(settings)]


def known_host_targets(settings: Settings) -> list[tuple[str, int]]:
    """Addresses a client may use to reach one login node directly."""
    return [(node.address, node.port) for node in login_nodes(settings)]


def node_spec(settings: Settings, node: LoginNode) -> DaemonSpec:
    """How to run login node ``node``'s sshd (foreground, PID 1 of its PID namespace)."""
    paths = settings.paths
    log = paths.log_file(node.daemon)
    return DaemonSpec(
        name=node.daemon,
        comm="sshd",
        argv=in_node_namespace(
            settings,
            node.name,
            (executable("sshd"), "-D", "-f", str(config_path(settings, node)), "-E", str(log)),
            pid_file=paths.pid_file(node.daemon),
        ),
        pid_file=paths.pid_file(node.daemon),
        logs=(log, paths.output_file(node.daemon)),
        config_files=(config_path(settings, node), paths.host_key, paths.node_hosts),
        ready=lambda: ssh_banner(node.address, node.port).startswith("SSH-"),
        ready_timeout=10.0,
        ports=((node.address, node.port),),
    )


def alias_spec(settings: Settings) -> DaemonSpec:
    """How to run the forwarder that makes the SSH port reach every login node in turn."""
    paths = settings.paths
    host, port = settings.ssh_host, settings.ssh_port
    targets = [f"--to={node.address}:{node.port}" for node in login_nodes(settings)]
    return DaemonSpec(
        name=ALIAS_DAEMON,
        comm=alias.COMM,
        argv=(
            executable("setsid"), "--fork", sys.executable, "-I", "-S", alias.__file__,
            f"--listen={settings.ssh_listen}:{port}", *targets,
            f"--pid-file={paths.pid_file(ALIAS_DAEMON)}",
            f"--log={paths.log_file(ALIAS_DAEMON)}",
        ),
        pid_file=paths.pid_file(ALIAS_DAEMON),
        logs=(paths.log_file(ALIAS_DAEMON), paths.output_file(ALIAS_DAEMON)),
        config_files=(Path(alias.__file__),),  # a new version of the program restarts it
        ready=lambda: ssh_banner(host, port).startswith("SSH-"),
        ready_timeout=10.0,
        ports=((host, port),),
    )


def specs(settings: Settings) -> list[DaemonSpec]:
    """The login nodes' sshds and the alias, in start order (none with one login node)."""
    nodes = login_nodes(settings)
    if not nodes:
        return []
    return [*(node_spec(settings, node) for node in nodes), alias_spec(settings)]
