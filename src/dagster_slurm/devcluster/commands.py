"""``dagster-slurm dev-cluster up|down|status|env`` (argument parsing only)."""

from __future__ import annotations

import argparse
import sys

from dagster_slurm.devcluster.cluster import DevCluster
from dagster_slurm.devcluster.layout import (
    DEFAULT_STATE_DIR,
    SSH_LISTEN_ENV,
    SSH_PORT_ENV,
    STATE_DIR_ENV,
    USER_ENV,
)


def _progress(line: str) -> None:
    print(line, flush=True)


def _cluster(args: argparse.Namespace, progress: bool = True) -> DevCluster:
    return DevCluster(
        state_dir=args.state_dir,
        ssh_port=args.ssh_port,
        user=args.user,
        ssh_listen=args.ssh_listen,
        progress=_progress if progress else None,
    )


def _up(args: argparse.Namespace) -> int:
    info = _cluster(args).up()
    print(f"login: ssh -i {info.key_path} -p {info.port} {info.user}@{info.host}")
    print(f'environment: eval "$(dagster-slurm dev-cluster env --state-dir {info.state_dir})"')
    return 0


def _down(args: argparse.Namespace) -> int:
    _cluster(args).down(purge=args.purge)
    return 0


def _status(args: argparse.Namespace) -> int:
    status = _cluster(args, progress=False).status()
    print(status.render())
    return 0 if status.ok else 1


def _env(args: argparse.Namespace) -> int:
    for line in _cluster(args, progress=False).info().export_lines():
        print(line)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``dev-cluster`` command group."""
    group = subparsers.add_parser(
        "dev-cluster",
        help="start/stop a Slurm cluster of real daemons on this machine (root)",
        description="A development Slurm cluster on this machine: munged, MariaDB, slurmdbd, "
        "slurmctld, four slurmd nodes (partitions cpu and gpu) and an sshd login node.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        default=None,
        help=f"directory for all files of the cluster (env {STATE_DIR_ENV}; default {DEFAULT_STATE_DIR})",
    )
    common.add_argument(
        "--ssh-port", type=int, default=None, help=f"sshd port on 127.0.0.1 (env {SSH_PORT_ENV})"
    )
    common.add_argument(
        "--ssh-listen",
        default=None,
        help=f"address sshd binds (env {SSH_LISTEN_ENV}; default 127.0.0.1)",
    )
    common.add_argument("--user", default=None, help=f"non-root submitter account (env {USER_ENV})")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up", parents=[common], help="install what is missing and start what is not running"
    )
    up.set_defaults(handler=_up)
    down = actions.add_parser(
        "down", parents=[common], help="cancel all jobs and stop the cluster's daemons"
    )
    down.add_argument("--purge", action="store_true", help="also remove the state directory")
    down.set_defaults(handler=_down)
    status = actions.add_parser(
        "status", parents=[common], help="show the daemons; exit 1 unless all run"
    )
    status.set_defaults(handler=_status)
    env = actions.add_parser(
        "env", parents=[common], help="print export lines pointing clients at the cluster"
    )
    env.set_defaults(handler=_env)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: dagster-slurm dev-cluster ...")
