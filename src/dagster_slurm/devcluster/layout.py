"""Fixed shape of the development cluster: ports, nodes, partitions and file layout.

Everything the cluster writes lives under one state directory (default ``/tmp/dslurm``,
kept short because Unix socket paths of jobs may later live below it). The ports are
all in one table so that they can be checked for conflicts in one place; they lie in an
uncommon range so that a real Slurm installation on the same machine is not disturbed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: Environment variable that overrides the default state directory.
STATE_DIR_ENV = "DAGSTER_SLURM_DEV_STATE_DIR"
#: Environment variable that overrides the default SSH port of the login node.
SSH_PORT_ENV = "DAGSTER_SLURM_DEV_SSH_PORT"
#: Environment variable that overrides the name of the submitter user.
USER_ENV = "DAGSTER_SLURM_DEV_USER"
#: Environment variable that overrides the address sshd listens on (e.g. 0.0.0.0 in a
#: container whose port is published to the host).
SSH_LISTEN_ENV = "DAGSTER_SLURM_DEV_SSH_LISTEN"

DEFAULT_STATE_DIR = Path("/tmp/dslurm")
DEFAULT_SSH_PORT = 2222
DEFAULT_USER = "dslurm"
#: A second unprivileged account, never used to submit: it stands for the other users of a
#: shared cluster (tests check what it cannot read).
OTHER_USER = "dslurm2"
#: Hostname of the login node (sshd runs in a namespace of its own with this name).
LOGIN_NODE = "login"
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

    @property
    def port(self) -> int:
        """TCP port of this node's slurmd."""
        return PORTS[self.daemon]


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
    ``ssh_port`` is the port of the login node's sshd; ``user`` is the non-root account
    jobs are submitted as over SSH; ``ssh_listen`` the address sshd binds (loopback
    unless the cluster runs in a container that publishes the port).
    """

    state_dir: Path = DEFAULT_STATE_DIR
    ssh_port: int = DEFAULT_SSH_PORT
    user: str = DEFAULT_USER
    ssh_listen: str = LOOPBACK

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
        """Directory owned by the submitter where deployments are placed."""
        return self.home / DEPLOYMENT_DIR_NAME

    @property
    def paths(self) -> Paths:
        """File layout below :attr:`state_dir`."""
        return Paths(self.state_dir)


def resolve_settings(
    state_dir: str | os.PathLike[str] | None = None,
    ssh_port: int | None = None,
    user: str | None = None,
    ssh_listen: str | None = None,
) -> Settings:
    """Combine explicit values, environment variables and the values ``up`` recorded.

    Precedence per value: explicit argument, then environment variable, then what the
    last ``up`` recorded in the state directory, then the default.
    """
    root = Path(state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)
    recorded = _read_recorded(Paths(root).settings_file)
    port = ssh_port or os.environ.get(SSH_PORT_ENV) or recorded.get("ssh_port")
    name = user or os.environ.get(USER_ENV) or recorded.get("user")
    listen = ssh_listen or os.environ.get(SSH_LISTEN_ENV) or recorded.get("ssh_listen")
    return Settings(
        state_dir=root.absolute(),
        ssh_port=int(str(port or DEFAULT_SSH_PORT)),
        user=str(name or DEFAULT_USER),
        ssh_listen=str(listen or LOOPBACK),
    )


def record_settings(settings: Settings) -> None:
    """Remember the SSH settings so that later ``status``/``env``/``down`` agree with ``up``."""
    data = {"ssh_port": settings.ssh_port, "user": settings.user, "ssh_listen": settings.ssh_listen}
    path = settings.paths.settings_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


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
    def known_hosts(self) -> Path:
        return self.ssh / "known_hosts"

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
