"""What a client needs to reach the development cluster, and what ``status`` reports."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dagster_slurm.devcluster.layout import (
    CPU_PARTITION,
    GPU_PARTITION,
    PARTITIONS,
    Paths,
    Settings,
    site_daemon,
)
from dagster_slurm.devcluster.logins import login_nodes

#: Prefix of the variables ``env`` exports for each login site (``..._OTP_PORT`` ...).
SITE_ENV_PREFIX = "DAGSTER_SLURM_DEV_"


@dataclass(frozen=True)
class LoginSiteInfo:
    """One extra login site: ``name`` (``otp``, ``cert``, ``bastion``), the address its sshd
    listens on (``host``/``port``) and its ``log_path`` (one line per accepted login)."""

    name: str
    host: str
    port: int
    log_path: Path


#: With another Slurm release than the machine's: the directory of the wrappers that run
#: its client commands (``squeue``...) on this machine.
CLIENT_BIN_ENV = "DAGSTER_SLURM_DEV_CLIENT_BIN"


def slurm_command(env: Mapping[str, str], name: str) -> str:
    """Slurm client command ``name`` for a cluster whose variables are ``env`` (its
    :meth:`DevClusterInfo.env`): the release's wrapper when it has one, else ``name``."""
    directory = env.get(CLIENT_BIN_ENV)
    return str(Path(directory) / name) if directory else name


@dataclass(frozen=True)
class LoginNodeInfo:
    """One of several login nodes behind the SSH port: its ``name`` (also its hostname)
    and the address of its own sshd (``host``/``port``), for aiming at that node."""

    name: str
    host: str
    port: int


@dataclass(frozen=True)
class DevClusterInfo:
    """Connection details of the development cluster.

    ``host``/``port`` is the login node's sshd, ``user`` the non-root submitter,
    ``key_path`` its private key (no passphrase), ``known_hosts_path`` a known_hosts file
    holding the login node's host key, ``deployment_base_path`` a directory on the
    cluster owned by ``user``, ``slurm_conf`` the configuration for running Slurm
    commands locally, ``partition``/``gpu_partition`` the default CPU partition and the
    partition with (fake) GPUs, ``partitions`` all partitions, ``state_dir`` the
    directory holding all of the cluster's files, ``login_sites`` the extra login sites
    chosen, ``cert_key_path`` the key that ``issue-cert`` certifies by default (None
    without the ``cert`` site), ``login_nodes`` the login nodes behind ``host``/``port``
    when there are several (empty with the one login node ``login``).
    """

    host: str
    port: int
    user: str
    key_path: Path
    known_hosts_path: Path
    deployment_base_path: Path
    slurm_conf: Path
    partition: str
    gpu_partition: str
    partitions: tuple[str, ...]
    state_dir: Path
    login_sites: tuple[LoginSiteInfo, ...] = ()
    cert_key_path: Path | None = None
    login_nodes: tuple[LoginNodeInfo, ...] = ()
    slurm_release: str = ""
    client_bin: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> DevClusterInfo:
        paths = settings.paths
        return cls(
            host=settings.ssh_host,
            port=settings.ssh_port,
            user=settings.user,
            key_path=paths.client_key,
            known_hosts_path=paths.known_hosts,
            deployment_base_path=settings.deployment_base_path,
            slurm_conf=paths.slurm_conf,
            partition=CPU_PARTITION,
            gpu_partition=GPU_PARTITION,
            partitions=PARTITIONS,
            state_dir=settings.state_dir,
            login_sites=tuple(
                LoginSiteInfo(name, settings.ssh_host, settings.site_port(name),
                              paths.log_file(site_daemon(name)))
                for name in settings.login_sites
            ),
            cert_key_path=paths.cert_client_key if "cert" in settings.login_sites else None,
            login_nodes=tuple(
                LoginNodeInfo(node.name, node.address, node.port)
                for node in login_nodes(settings)
            ),
            slurm_release=settings.slurm_release,
            client_bin=paths.client_bin if settings.slurm_root is not None else None,
        )

    def site(self, name: str) -> LoginSiteInfo:
        """The login site ``name``; :class:`KeyError` when it was not chosen."""
        for site in self.login_sites:
            if site.name == name:
                return site
        raise KeyError(f"login site {name!r} is not up (dev-cluster up --login-sites {name})")

    def login_node(self, name: str) -> LoginNodeInfo:
        """Login node ``name`` (``login1`` ...); :class:`KeyError` when it does not run."""
        for node in self.login_nodes:
            if node.name == name:
                return node
        raise KeyError(f"login node {name!r} is not up (dev-cluster up --login-nodes 2)")

    def env_at(self, name: str) -> dict[str, str]:
        """:meth:`env` aimed at login node ``name`` itself instead of the alias."""
        node = self.login_node(name)
        return {**self.env(), "SLURM_EDGE_NODE_HOST": node.host,
                "SLURM_EDGE_NODE_PORT": str(node.port)}

    def node_tmp(self, node: str) -> Path:
        """Where the host finds what node ``node`` (e.g. ``c1``, or ``login``) sees as /tmp."""
        return Paths(self.state_dir).node_tmp(node)

    def env(self) -> dict[str, str]:
        """Environment variables that point the library (and Slurm tools) at this cluster."""
        return {
            "SLURM_EDGE_NODE_HOST": self.host,
            "SLURM_EDGE_NODE_PORT": str(self.port),
            "SLURM_EDGE_NODE_USER": self.user,
            "SLURM_EDGE_NODE_KEY_PATH": str(self.key_path),
            "SLURM_EDGE_NODE_KNOWN_HOSTS": str(self.known_hosts_path),
            "SLURM_DEPLOYMENT_BASE_PATH": str(self.deployment_base_path),
            "SLURM_PARTITION": self.partition,
            "SLURM_GPU_PARTITION": self.gpu_partition,
            "SLURM_CONF": str(self.slurm_conf),
            **self.site_env(),
            **({CLIENT_BIN_ENV: str(self.client_bin)} if self.client_bin else {}),
        }

    def slurm_command(self, name: str) -> str:
        """The program to run for Slurm client command ``name`` on this machine: the
        wrapper of the cluster's Slurm release (root only), else ``name`` itself."""
        return slurm_command(self.env(), name)

    def site_env(self) -> dict[str, str]:
        """``DAGSTER_SLURM_DEV_<SITE>_PORT`` and ``_LOG`` of each login site, and
        ``DAGSTER_SLURM_DEV_CERT_KEY_PATH`` with the ``cert`` site, and
        ``DAGSTER_SLURM_DEV_LOGIN<N>_HOST`` and ``_PORT`` of each of several login nodes."""
        env: dict[str, str] = {}
        for site in self.login_sites:
            stem = f"{SITE_ENV_PREFIX}{site.name.upper()}"
            env[f"{stem}_PORT"] = str(site.port)
            env[f"{stem}_LOG"] = str(site.log_path)
        if self.cert_key_path is not None:
            env[f"{SITE_ENV_PREFIX}CERT_KEY_PATH"] = str(self.cert_key_path)
        for node in self.login_nodes:
            stem = f"{SITE_ENV_PREFIX}{node.name.upper()}"
            env[f"{stem}_HOST"] = node.host
            env[f"{stem}_PORT"] = str(node.port)
        return env

    def export_lines(self) -> list[str]:
        """``export NAME=value`` lines for a POSIX shell, values quoted."""
        lines = [f"export {name}={shlex.quote(value)}" for name, value in self.env().items()]
        if self.client_bin is not None:
            lines.append(f'export PATH={shlex.quote(str(self.client_bin))}:"$PATH"')
        return lines


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon: its recorded pid (None if never started) and whether it still runs."""

    name: str
    pid: int | None
    alive: bool


@dataclass(frozen=True)
class ClusterStatus:
    """Every daemon's status plus the ``sinfo`` summary (empty when slurmctld is down)."""

    daemons: tuple[DaemonStatus, ...]
    sinfo: str

    @property
    def ok(self) -> bool:
        """True when every daemon runs."""
        return all(d.alive for d in self.daemons)

    def render(self) -> str:
        """Table of daemons followed by the sinfo summary."""
        lines = [f"{'daemon':<12} {'pid':>8}  state"]
        for d in self.daemons:
            pid = str(d.pid) if d.pid is not None else "-"
            lines.append(f"{d.name:<12} {pid:>8}  {'running' if d.alive else 'stopped'}")
        if self.sinfo:
            lines += ["", self.sinfo]
        return "\n".join(lines)
