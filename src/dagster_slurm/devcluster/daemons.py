"""The daemons of the development cluster, in start order, as data.

A :class:`DaemonSpec` says how to launch one daemon (argv of a launcher that detaches
it), which pid file it writes, which logs to show when it fails, which configuration
files it depends on (their content goes into :meth:`DaemonSpec.digest`, so a changed
file restarts the daemon) and how to tell that it is ready.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dagster_slurm.devcluster import database
from dagster_slurm.devcluster.layout import LOGIN_NODE, LOOPBACK, NODES, Node, Settings
from dagster_slurm.devcluster.probes import ClusterProbes
from dagster_slurm.devcluster.processes import SYSTEM_PATH, daemon_env

#: Runs inside a fresh UTS + mount namespace (private propagation, so the host never sees
#: these mounts; they go away with the namespace's last process): set the node's hostname,
#: mount its hosts file over /etc/hosts and its own directory over /tmp, with the state
#: directory (the shared filesystem) mounted back at its own path when it lies below /tmp,
#: then become the daemon. Arguments: hostname, hosts file, node tmp, state dir, argv.
NODE_SHIM = (
    'hostname "$1" && mount --bind "$2" /etc/hosts'
    ' && case $4 in /tmp/*) mkdir -p "$3${4#/tmp}" && mount --bind "$4" "$3${4#/tmp}" ;; esac'
    ' && mount --rbind "$3" /tmp && shift 4 && exec "$@"'
)

#: Runs as the program of ``unshare --pid`` (without ``--fork``): its first child becomes
#: PID 1 of the new PID namespace, mounts that namespace's /proc (in the node's mount
#: namespace) and becomes the daemon, which must stay in the foreground (the namespace
#: ends with its PID 1). The daemon's pid as the host sees it goes to the pid file (the
#: daemon's own pid file would hold its namespace pid). Arguments: pid file, argv.
PID_NAMESPACE_SHIM = (
    'pid_file=$1; shift; (mount -t proc proc /proc && exec "$@") < /dev/null &'
    ' printf "%s\\n" "$!" > "$pid_file"'
)


def in_node_namespace(
    settings: Settings, hostname: str, argv: tuple[str, ...], pid_file: Path | None = None
) -> tuple[str, ...]:
    """``argv`` run as node ``hostname``: own hostname, /etc/hosts and /tmp (see NODE_SHIM).

    With ``pid_file`` also in a PID namespace of its own (see PID_NAMESPACE_SHIM); ``argv``
    must then run in the foreground, and ``pid_file`` receives its host pid.
    """
    paths = settings.paths
    if pid_file is not None:
        argv = (
            executable("unshare"), "--pid", "/bin/sh", "-c", PID_NAMESPACE_SHIM, "node-init",
            str(pid_file), *argv,
        )
    return (
        executable("unshare"),
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        NODE_SHIM,
        "node-shim",
        hostname,
        str(paths.node_hosts),
        str(paths.node_tmp(hostname)),
        str(settings.state_dir),
        *argv,
    )


def executable(name: str) -> str:
    """Absolute path of a system program (daemons such as sshd insist on one)."""
    return shutil.which(name, path=SYSTEM_PATH) or name


@dataclass(frozen=True)
class DaemonSpec:
    """How to run and check one daemon.

    ``name`` is its key in the pid records and in ``status``; ``comm`` the kernel command
    name of the running daemon; ``argv`` the launcher, which must exit once the daemon
    has detached; ``ports`` the (address, port) pairs it binds (checked to be free before a start);
    ``ready`` a quick probe polled for at most ``ready_timeout`` seconds.
    ``before_launch`` runs right before each launch, ``after_ready`` once the daemon is
    ready after a launch, ``describe`` tells what the daemon looks like when it is late.
    """

    name: str
    comm: str
    argv: tuple[str, ...]
    pid_file: Path
    logs: tuple[Path, ...]
    config_files: tuple[Path, ...]
    ready: Callable[[], bool]
    ready_timeout: float = 20.0
    ports: tuple[tuple[str, int], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    before_launch: Callable[[], object] | None = None
    after_ready: Callable[[], object] | None = None
    describe: Callable[[], str] | None = None

    def digest(self) -> str:
        """Hash of the command line and the current content of the configuration files."""
        hasher = hashlib.sha256(json.dumps(self.argv).encode())
        for path in self.config_files:
            hasher.update(str(path).encode())
            try:
                hasher.update(path.read_bytes())
            except OSError:
                hasher.update(b"<missing>")
        return hasher.hexdigest()[:16]


class NodeReadiness:
    """Probe for one node: ready when Slurm reports it usable.

    A node that answers but was left DOWN or DRAINED (e.g. by the controller's saved
    state from an earlier run) is resumed, at most every two seconds. After
    :meth:`expect_start_after`, the node counts as ready only once a slurmd started at
    or after that time has registered (the controller may still show the old one).
    """

    def __init__(self, probes: ClusterProbes, node: str) -> None:
        self.probes = probes
        self.node = node
        self.last_state = "unknown"
        self._last_resume = 0.0
        self._started_after: float | None = None

    def expect_start_after(self, epoch: float) -> None:
        """Require a slurmd registration from a daemon started at ``epoch`` or later."""
        self._started_after = float(int(epoch))

    def __call__(self) -> bool:
        state = self.probes.node_states().get(self.node)
        if state is None:
            return False
        self.last_state = "+".join([state.base, *sorted(state.flags)])
        if self._started_after is not None and (
            state.slurmd_started is None or state.slurmd_started < self._started_after
        ):
            self.last_state += " (new slurmd not registered yet)"
            return False
        if state.ready:
            return True
        now = time.monotonic()
        if state.resumable and now - self._last_resume > 2.0:
            self._last_resume = now
            self.probes.resume(self.node)
        return False


def _munged(settings: Settings, probes: ClusterProbes) -> DaemonSpec:
    paths = settings.paths
    return DaemonSpec(
        name="munged",
        comm="munged",
        argv=(
            executable("munged"),
            f"--socket={paths.munge_socket}",
            f"--key-file={paths.munge_key}",
            f"--pid-file={paths.pid_file('munged')}",
            f"--log-file={paths.log_file('munged')}",
            f"--seed-file={paths.munge_seed}",
        ),
        pid_file=paths.pid_file("munged"),
        logs=(paths.log_file("munged"), paths.output_file("munged")),
        config_files=(paths.munge_key,),
        ready=probes.munge,
        ready_timeout=10.0,
    )


def _mariadb(settings: Settings, probes: ClusterProbes) -> DaemonSpec:
    paths = settings.paths
    env = daemon_env()
    return DaemonSpec(
        name="mariadb",
        comm="mariadbd",
        argv=(
            executable("setsid"),
            "--fork",
            executable("mariadbd"),
            "--no-defaults",
            f"--datadir={paths.mariadb_data}",
            f"--socket={paths.mariadb_socket}",
            f"--port={settings.port('mariadb')}",
            f"--bind-address={LOOPBACK}",
            f"--pid-file={paths.pid_file('mariadb')}",
            f"--log-error={paths.log_file('mariadb')}",
            "--user=root",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=16M",
            "--innodb-lock-wait-timeout=900",
            "--performance-schema=OFF",
            "--skip-name-resolve",
        ),
        pid_file=paths.pid_file("mariadb"),
        logs=(paths.log_file("mariadb"), paths.output_file("mariadb")),
        config_files=(),
        ready=probes.mariadb,
        ready_timeout=30.0,
        ports=((LOOPBACK, settings.port("mariadb")),),
        before_launch=lambda: database.install_database(paths, env),
        after_ready=lambda: database.apply_grants(paths, database.ensure_password(paths), env),
    )


def _slurmdbd(settings: Settings, probes: ClusterProbes) -> DaemonSpec:
    paths = settings.paths
    return DaemonSpec(
        name="slurmdbd",
        comm="slurmdbd",
        argv=settings.slurm_side((executable("slurmdbd"),)),
        pid_file=paths.pid_file("slurmdbd"),
        logs=(paths.log_file("slurmdbd"), paths.output_file("slurmdbd")),
        config_files=(paths.slurmdbd_conf,),
        ready=probes.slurmdbd,
        ports=((LOOPBACK, settings.port("slurmdbd")),),
        env={"SLURM_CONF": str(paths.slurm_conf)},
    )


def _slurmctld(settings: Settings, probes: ClusterProbes) -> DaemonSpec:
    paths = settings.paths
    return DaemonSpec(
        name="slurmctld",
        comm="slurmctld",
        argv=settings.slurm_side((executable("slurmctld"), "-f", str(paths.slurm_conf))),
        pid_file=paths.pid_file("slurmctld"),
        logs=(paths.log_file("slurmctld"), paths.output_file("slurmctld")),
        config_files=(paths.slurm_conf, paths.gres_conf),
        ready=probes.slurmctld,
        ports=((LOOPBACK, settings.port("slurmctld")),),
        env={"SLURM_CONF": str(paths.slurm_conf)},
    )


def _slurmd(settings: Settings, probes: ClusterProbes, node: Node) -> DaemonSpec:
    paths = settings.paths
    readiness = NodeReadiness(probes, node.name)
    return DaemonSpec(
        name=node.daemon,
        comm="slurmd",
        argv=in_node_namespace(
            settings,
            node.name,
            settings.slurm_side((executable("slurmd"), "-D", "-f", str(paths.slurm_conf),
                                  "-N", node.name), in_node=True),
            pid_file=paths.pid_file(node.daemon),
        ),
        pid_file=paths.pid_file(node.daemon),
        logs=(paths.log_file(node.daemon), paths.output_file(node.daemon)),
        config_files=(paths.slurm_conf, paths.gres_conf, paths.node_hosts),
        ready=readiness,
        ports=((node.address, settings.node_port(node)),),
        env={"SLURM_CONF": str(paths.slurm_conf)},
        before_launch=lambda: readiness.expect_start_after(time.time()),
        describe=lambda: f"node state {readiness.last_state}",
    )


def _sshd(settings: Settings, probes: ClusterProbes) -> DaemonSpec:
    paths = settings.paths
    return DaemonSpec(
        name="sshd",
        comm="sshd",
        argv=in_node_namespace(
            settings,
            LOGIN_NODE,
            settings.slurm_side((executable("sshd"), "-f", str(paths.sshd_config),
                                  "-E", str(paths.log_file("sshd"))), in_node=True),
        ),
        pid_file=paths.pid_file("sshd"),
        logs=(paths.log_file("sshd"), paths.output_file("sshd")),
        config_files=(paths.sshd_config, paths.host_key, paths.node_hosts),
        ready=probes.sshd,
        ready_timeout=10.0,
        ports=((settings.ssh_host, settings.ssh_port),),
    )


def build_specs(settings: Settings, probes: ClusterProbes) -> list[DaemonSpec]:
    """All daemons in start order (``down`` stops them in reverse order)."""
    return [
        _munged(settings, probes),
        _mariadb(settings, probes),
        _slurmdbd(settings, probes),
        _slurmctld(settings, probes),
        *(_slurmd(settings, probes, node) for node in NODES),
        _sshd(settings, probes),
    ]


#: Daemon name -> kernel command name (``/proc/PID/comm``), in start order.
DAEMON_COMMS: dict[str, str] = {
    "munged": "munged",
    "mariadb": "mariadbd",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurmctld",
    **{node.daemon: "slurmd" for node in NODES},
    "sshd": "sshd",
}


def daemon_names() -> list[str]:
    """Names of all daemons in start order, without building their specs."""
    return list(DAEMON_COMMS)
