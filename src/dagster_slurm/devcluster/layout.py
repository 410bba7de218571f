"""Fixed shape of the development cluster: ports, nodes, partitions and file layout.

Everything the cluster writes lives under one state directory (default ``/tmp/dslurm``,
kept short because Unix socket paths of jobs may later live below it). The ports are
all in one table so that they can be checked for conflicts in one place; they lie in an
uncommon range so that a real Slurm installation on the same machine is not disturbed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dagster_slurm.devcluster import release as releases
from dagster_slurm.devcluster.errors import DevClusterError

#: Environment variable that overrides the default state directory.
STATE_DIR_ENV = "DAGSTER_SLURM_DEV_STATE_DIR"
#: Environment variable that overrides the default SSH port of the login node.
SSH_PORT_ENV = "DAGSTER_SLURM_DEV_SSH_PORT"
#: Environment variable that overrides the name of the submitter user.
USER_ENV = "DAGSTER_SLURM_DEV_USER"
#: Environment variable that overrides the address sshd listens on (e.g. 0.0.0.0 in a
#: container whose port is published to the host).
SSH_LISTEN_ENV = "DAGSTER_SLURM_DEV_SSH_LISTEN"
#: Environment variable that chooses the extra login sites (see :func:`parse_login_sites`).
LOGIN_SITES_ENV = "DAGSTER_SLURM_DEV_LOGIN_SITES"
#: Environment variable that moves every port of the cluster (its daemons' and its SSH port's
#: default) by the same amount, so that a second cluster (with its own state directory) runs
#: beside the first without sharing a port.
PORT_OFFSET_ENV = "DAGSTER_SLURM_DEV_PORT_OFFSET"
#: Environment variable that chooses how many login nodes stand behind the SSH port (1: the
#: login node ``login``; 2 or more: ``login1``, ``login2``, ... behind a round-robin alias).
LOGIN_NODES_ENV = "DAGSTER_SLURM_DEV_LOGIN_NODES"
#: Most login nodes ``up`` runs (their addresses are 127.0.1.101 and up).
MAX_LOGIN_NODES = 4
#: Environment variables naming pre-deployed payload environments (a venv each) that jobs
#: of a cluster running another Slurm release need from the machine (see
#: :func:`dagster_slurm.devcluster.release.payload_paths`).
PAYLOAD_ENV_VARS: tuple[str, ...] = (
    "DAGSTER_SLURM_TEST_ENV_PATH", "DAGSTER_SLURM_TEST_RAY_ENV_PATH",
)

DEFAULT_STATE_DIR = Path("/tmp/dslurm")
DEFAULT_SSH_PORT = 2222
DEFAULT_USER = "dslurm"
#: A second unprivileged account, never used to submit: it stands for the other users of a
#: shared cluster (tests check what it cannot read).
OTHER_USER = "dslurm2"
#: Hostname of the login node (sshd runs in a namespace of its own with this name).
LOGIN_NODE = "login"
#: Hostname of the bastion site, a machine of its own in front of the login node.
BASTION_NODE = "bastion"
#: Address the login node's name resolves to inside the cluster (a loopback alias).
LOGIN_ADDRESS = "127.0.1.100"
#: Address every client-facing daemon listens on.
LOOPBACK = "127.0.0.1"
#: Name of the Slurm cluster as registered in the accounting database.
CLUSTER_NAME = "dagsterdev"
#: Name of the deployment directory inside the submitter's home.
DEPLOYMENT_DIR_NAME = "dagster-slurm"

#: TCP ports of the daemons (all bound to loopback addresses). The SSH port is separate
#: because users may need to move it (see :data:`SSH_PORT_ENV`).
PORTS: dict[str, int] = {
    "mariadb": 16806,
    "slurmctld": 16817,
    "slurmdbd": 16819,
    "slurmd-c1": 16821,
    "slurmd-c2": 16822,
    "slurmd-g1": 16823,
    "slurmd-g2": 16824,
}

#: The extra login sites ``up`` can start next to the login node, in start order, with the
#: offset of each one's port from the login node's SSH port: ``otp`` asks for a key and a
#: one-time code, ``cert`` accepts only certificates of the cluster's user CA, ``bastion``
#: is a jump host in front of the login node.
LOGIN_SITE_PORT_OFFSETS: dict[str, int] = {"otp": 1, "cert": 2, "bastion": 3}
LOGIN_SITES: tuple[str, ...] = tuple(LOGIN_SITE_PORT_OFFSETS)


def site_daemon(site: str) -> str:
    """Name of login site ``site``'s sshd in the pid records, ``status`` and log files."""
    return f"sshd-{site}"


def parse_login_sites(text: str | Iterable[str]) -> tuple[str, ...]:
    """Site names from ``otp,cert``, ``all`` or ``none`` (or an iterable of names), in
    :data:`LOGIN_SITES` order without repeats. Raises :class:`ValueError` naming an unknown
    site and the valid choices."""
    words = text.replace(",", " ").split() if isinstance(text, str) else list(text)
    chosen: set[str] = set()
    for word in words:
        word = word.strip().lower()
        if word == "all":
            chosen.update(LOGIN_SITES)
        elif word in LOGIN_SITES:
            chosen.add(word)
        elif word not in ("none", ""):
            raise ValueError(
                f"unknown login site {word!r}: choose from {', '.join(LOGIN_SITES)}, "
                "all or none (comma-separated)"
            )
    return tuple(site for site in LOGIN_SITES if site in chosen)


@dataclass(frozen=True)
class Node:
    """One compute node: its Slurm name (also its hostname), loopback address and GPUs.

    ``gpus`` is the number of fake GPU devices the node offers as ``gpu`` GRES (0 for none).
    """

    name: str
    address: str
    partition: str
    gpus: int = 0

    @property
    def daemon(self) -> str:
        """Name of this node's slurmd in the pid records and ``status`` output."""
        return f"slurmd-{self.name}"



CPUS_PER_NODE = 2
REAL_MEMORY_MB = 8000
DEF_MEM_PER_CPU_MB = 1000
CPU_PARTITION = "cpu"
GPU_PARTITION = "gpu"
PARTITION_MAX_TIME = "02:00:00"
GPUS_PER_GPU_NODE = 2

NODES: tuple[Node, ...] = (
    Node("c1", "127.0.1.1", CPU_PARTITION),
    Node("c2", "127.0.1.2", CPU_PARTITION),
    Node("g1", "127.0.1.3", GPU_PARTITION, GPUS_PER_GPU_NODE),
    Node("g2", "127.0.1.4", GPU_PARTITION, GPUS_PER_GPU_NODE),
)
PARTITIONS: tuple[str, ...] = (CPU_PARTITION, GPU_PARTITION)


@dataclass(frozen=True)
class Settings:
    """Values a user may choose: where the state lives, the SSH port and the submitter.

    ``state_dir`` holds all configuration, logs, pid files, spool and database data;
    ``ssh_port`` is the port of the login node's sshd; ``port_offset`` is added to every
    daemon's port (:data:`PORTS`; 0 for the first cluster of a machine); ``user`` is the
    non-root account jobs are submitted as over SSH; ``ssh_listen`` the address sshd binds
    (loopback unless the cluster runs in a container that publishes the port);
    ``login_sites`` the extra login sites to run (names of :data:`LOGIN_SITES`);
    ``login_nodes`` how many login nodes answer on the SSH port (see
    :mod:`dagster_slurm.devcluster.logins`); ``slurm_release`` the Slurm
    release chosen (empty: the machine's own), ``slurm_root`` the root its daemons and
    commands run from (None: the machine's own packages), ``payload_paths`` directories
    of the machine that jobs in that root see read-only (payload environments).
    """

    state_dir: Path = DEFAULT_STATE_DIR
    ssh_port: int = DEFAULT_SSH_PORT
    user: str = DEFAULT_USER
    ssh_listen: str = LOOPBACK
    login_sites: tuple[str, ...] = ()
    port_offset: int = 0
    login_nodes: int = 1
    slurm_release: str = ""
    slurm_root: Path | None = None
    payload_paths: tuple[str, ...] = ()

    @property
    def root_mounts(self) -> list[str]:
        """What every process of the cluster in :attr:`slurm_root` sees of the machine."""
        return releases.root_mounts(self.state_dir, self.payload_paths)

    def slurm_side(self, argv: Iterable[str], in_node: bool = False) -> tuple[str, ...]:
        """``argv`` of a program of this cluster's Slurm release (see
        :func:`dagster_slurm.devcluster.release.slurm_side`)."""
        return releases.slurm_side(self.slurm_root, self.root_mounts, tuple(argv), in_node)

    def port(self, daemon: str) -> int:
        """TCP port of ``daemon`` (a key of :data:`PORTS`) in this cluster."""
        return PORTS[daemon] + self.port_offset

    def node_port(self, node: Node) -> int:
        """TCP port of compute node ``node``'s slurmd in this cluster."""
        return self.port(node.daemon)

    def site_port(self, site: str) -> int:
        """SSH port of login site ``site``: the login node's port plus the site's offset."""
        return self.ssh_port + LOGIN_SITE_PORT_OFFSETS[site]

    @property
    def ssh_host(self) -> str:
        """Address clients connect to: the listen address, or loopback for a wildcard."""
        return LOOPBACK if self.ssh_listen in ("0.0.0.0", "::", "") else self.ssh_listen

    @property
    def home(self) -> Path:
        """Home directory of the submitter user."""
        return Path("/home") / self.user

    @property
    def deployment_base_path(self) -> Path:
        """Directory owned by the submitter where deployments are placed (one per cluster
        of the machine: a second cluster's runs never meet the first one's)."""
        suffix = f"-{self.port_offset}" if self.port_offset else ""
        return self.home / f"{DEPLOYMENT_DIR_NAME}{suffix}"

    @property
    def paths(self) -> Paths:
        """File layout below :attr:`state_dir`."""
        return Paths(self.state_dir)


def resolve_settings(
    state_dir: str | os.PathLike[str] | None = None,
    ssh_port: int | None = None,
    user: str | None = None,
    ssh_listen: str | None = None,
    login_sites: Iterable[str] | None = None,
    port_offset: int | None = None,
    login_nodes: int | None = None,
    slurm_release: str | None = None,
) -> Settings:
    """Combine explicit values, environment variables and the values ``up`` recorded.

    Precedence per value: explicit argument, then environment variable, then what the
    last ``up`` recorded in the state directory, then the default (no login sites, the
    machine's own Slurm release). Payload paths come from :data:`PAYLOAD_ENV_VARS` when
    any is set, else from the record. Raises :class:`DevClusterError` for an unknown site
    name or Slurm release.
    """
    root = Path(state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)
    recorded = _read_recorded(Paths(root).settings_file)
    offset_text = port_offset if port_offset is not None else (
        os.environ.get(PORT_OFFSET_ENV) or recorded.get("port_offset") or 0)
    try:
        offset = int(str(offset_text))
    except ValueError:
        raise DevClusterError(
            f"{PORT_OFFSET_ENV}={offset_text!r} is not a whole number of ports") from None
    if not 0 <= offset <= 20000:
        raise DevClusterError(f"{PORT_OFFSET_ENV}={offset} must lie between 0 and 20000")
    port = ssh_port or os.environ.get(SSH_PORT_ENV) or recorded.get("ssh_port")
    name = user or os.environ.get(USER_ENV) or recorded.get("user")
    listen = ssh_listen or os.environ.get(SSH_LISTEN_ENV) or recorded.get("ssh_listen")
    sites, source = login_sites, "login_sites"
    if sites is None:
        sites, source = os.environ.get(LOGIN_SITES_ENV), LOGIN_SITES_ENV
    if sites is None:
        recorded_sites = recorded.get("login_sites")
        sites = recorded_sites if isinstance(recorded_sites, list) else ()
        source = str(Paths(root).settings_file)
    try:
        chosen_sites = parse_login_sites(sites)
    except ValueError as exc:
        raise DevClusterError(f"{source}: {exc}") from None
    release_text = slurm_release if slurm_release is not None else (
        os.environ.get(releases.RELEASE_ENV) or recorded.get("slurm_release"))
    release = releases.parse_release(str(release_text or ""))
    payload = releases.payload_paths(os.environ, PAYLOAD_ENV_VARS)
    if not payload:
        recorded_payload = recorded.get("payload_paths")
        payload = tuple(map(str, recorded_payload)) if isinstance(recorded_payload, list) else ()
    return Settings(
        login_nodes=_login_node_count(login_nodes, recorded),
        state_dir=root.absolute(),
        ssh_port=int(str(port or DEFAULT_SSH_PORT + offset)),
        user=str(name or DEFAULT_USER),
        ssh_listen=str(listen or LOOPBACK),
        login_sites=chosen_sites,
        port_offset=offset,
        slurm_release=release,
        slurm_root=releases.root_for(release, releases.host_suite()),
        payload_paths=payload,
    )


def record_settings(settings: Settings) -> None:
    """Remember the SSH settings so that later ``status``/``env``/``down`` agree with ``up``."""
    data = {
        "ssh_port": settings.ssh_port,
        "user": settings.user,
        "ssh_listen": settings.ssh_listen,
        "login_sites": list(settings.login_sites),
        "port_offset": settings.port_offset,
        "login_nodes": settings.login_nodes,
        "slurm_release": settings.slurm_release,
        "payload_paths": list(settings.payload_paths),
    }
    path = settings.paths.settings_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _login_node_count(explicit: int | None, recorded: dict[str, object]) -> int:
    """Explicit count, else :data:`LOGIN_NODES_ENV`, else the recorded one, else 1."""
    text = explicit if explicit is not None else (
        os.environ.get(LOGIN_NODES_ENV) or recorded.get("login_nodes") or 1)
    try:
        count = int(str(text))
    except ValueError:
        raise DevClusterError(f"{LOGIN_NODES_ENV}={text!r} is not a whole number") from None
    if not 1 <= count <= MAX_LOGIN_NODES:
        raise DevClusterError(
            f"{LOGIN_NODES_ENV}={count}: the cluster runs 1 to {MAX_LOGIN_NODES} login nodes")
    return count


def _read_recorded(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Paths:
    """Locations of every file and directory below the state directory ``root``."""

    root: Path

    @property
    def etc(self) -> Path:
        """Rendered configuration files (world-readable, except slurmdbd.conf)."""
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def node_hosts(self) -> Path:
        """Hosts file bind-mounted over /etc/hosts inside each node's namespace."""
        return self.etc / "hosts"

    @property
    def sshd_config(self) -> Path:
        return self.etc / "sshd_config"

    def site_sshd_config(self, site: str) -> Path:
        """sshd_config of login site ``site`` (``otp``, ``cert``, ``bastion``)."""
        return self.etc / f"sshd_config.{site}"

    @property
    def nodes(self) -> Path:
        """Per-node private directories (root only, so no node reaches another's)."""
        return self.root / "nodes"

    def node_tmp(self, node: str) -> Path:
        """What node ``node`` (a compute node's name, or :data:`LOGIN_NODE`) sees as /tmp.

        Bind-mounted over /tmp in the node's mount namespace, with the state directory
        mounted back at its own path when it lies below /tmp (it is the cluster's shared
        filesystem).
        """
        return self.nodes / node / "tmp"

    @property
    def run(self) -> Path:
        """Pid files and Unix sockets (must be traversable by every user)."""
        return self.root / "run"

    @property
    def munge_socket(self) -> Path:
        return self.run / "munge.sock"

    @property
    def mariadb_socket(self) -> Path:
        return self.run / "mariadb.sock"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def secrets(self) -> Path:
        """Munge key, munged's PRNG seed and the database password (root only)."""
        return self.root / "secrets"

    @property
    def munge_key(self) -> Path:
        return self.secrets / "munge.key"

    @property
    def munge_seed(self) -> Path:
        return self.secrets / "munged.seed"

    @property
    def otp_secret(self) -> Path:
        """TOTP secret of the submitter on the ``otp`` site, hex encoded (root only)."""
        return self.secrets / "otp.secret"

    @property
    def otp_users(self) -> Path:
        """pam_oath's users file (pam_oath rewrites it after each login: last code used)."""
        return self.secrets / "otp.users"

    @property
    def programs(self) -> Path:
        """Links to system programs under another name (an sshd named as its PAM service)."""
        return self.root / "sbin"

    @property
    def mariadb_data(self) -> Path:
        return self.root / "mariadb"

    @property
    def mariadb_password(self) -> Path:
        """Password of the ``slurm`` database account (root only)."""
        return self.secrets / "mariadb-slurm.pw"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def ctld_state(self) -> Path:
        """slurmctld's StateSaveLocation."""
        return self.spool / "ctld"

    @property
    def devices(self) -> Path:
        """Character devices that stand in for GPUs."""
        return self.root / "dev"

    @property
    def ssh(self) -> Path:
        """Host key, client key and known_hosts (root only)."""
        return self.root / "ssh"

    @property
    def host_key(self) -> Path:
        return self.ssh / "host_ed25519"

    @property
    def client_key(self) -> Path:
        return self.ssh / "client_ed25519"

    @property
    def user_ca_key(self) -> Path:
        """Private key of the cluster's SSH user certificate authority (the ``cert`` site)."""
        return self.ssh / "user_ca_ed25519"

    @property
    def cert_client_key(self) -> Path:
        """Key pair that ``issue-cert`` certifies by default: in no authorized_keys file, so
        it logs in only with a certificate (and never changes how the client key logs in)."""
        return self.ssh / "cert_client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh / "known_hosts"

    @property
    def client_bin(self) -> Path:
        """Wrappers of the Slurm client commands (only with another Slurm release)."""
        return self.root / "bin"

    @property
    def records(self) -> Path:
        """JSON file with the pid records of the daemons ``up`` started."""
        return self.root / "daemons.json"

    @property
    def settings_file(self) -> Path:
        return self.root / "settings.json"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    def pid_file(self, daemon: str) -> Path:
        """Pid file a daemon writes itself."""
        return self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        """Log file a daemon writes itself."""
        return self.log / f"{daemon}.log"

    def output_file(self, daemon: str) -> Path:
        """Captured stdout/stderr of a daemon's launch (errors before its log opens)."""
        return self.log / f"{daemon}.out"
