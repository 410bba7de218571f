"""A development Slurm cluster of real daemons on this machine.

``DevCluster().up()`` installs the Debian packages it needs, then starts (as plain
processes, no init system) a private munged, MariaDB + slurmdbd for accounting,
slurmctld, four slurmd nodes with their own hostnames and loopback addresses (``cpu``:
c1, c2; ``gpu``: g1, g2 with two fake GPUs each) and an sshd login node on 127.0.0.1 that
accepts a generated key for a non-root submitter, and on request login sites that ask
for a one-time code, accept only certificates, or stand in front as a bastion
(:mod:`dagster_slurm.devcluster.sites`). It returns a :class:`DevClusterInfo` with
everything a client needs. The same is available as
``dagster-slurm dev-cluster up|down|status|env|otp|issue-cert``.
"""

from __future__ import annotations

from dagster_slurm.devcluster.cluster import DevCluster, require_root
from dagster_slurm.devcluster.errors import (
    DaemonStartError,
    DevClusterError,
    InstallError,
    NotRootError,
    PortInUseError,
)
from dagster_slurm.devcluster.info import (
    ClusterStatus,
    DaemonStatus,
    DevClusterInfo,
    LoginSiteInfo,
)
from dagster_slurm.devcluster.layout import (
    DEFAULT_SSH_PORT,
    DEFAULT_STATE_DIR,
    DEFAULT_USER,
    LOGIN_SITES,
    NODES,
    PORTS,
    STATE_DIR_ENV,
    Settings,
)

__all__ = [
    "DEFAULT_SSH_PORT",
    "DEFAULT_STATE_DIR",
    "DEFAULT_USER",
    "LOGIN_SITES",
    "NODES",
    "PORTS",
    "STATE_DIR_ENV",
    "ClusterStatus",
    "DaemonStartError",
    "DaemonStatus",
    "DevCluster",
    "DevClusterError",
    "DevClusterInfo",
    "InstallError",
    "LoginSiteInfo",
    "NotRootError",
    "PortInUseError",
    "Settings",
    "require_root",
]
