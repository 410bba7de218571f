"""Errors raised while starting, stopping or inspecting the development cluster."""

from __future__ import annotations

from dagster_slurm.errors import DagsterSlurmError


class DevClusterError(DagsterSlurmError):
    """The development cluster could not be started, stopped or inspected."""


class NotRootError(DevClusterError):
    """The operation needs root (it installs packages, creates users and starts daemons)."""


class InstallError(DevClusterError):
    """Required system packages are missing and could not be installed."""


class PortInUseError(DevClusterError):
    """A port the cluster needs is already taken by a process the cluster did not start."""


class DaemonStartError(DevClusterError):
    """A daemon did not start or did not become ready in time.

    ``daemon`` names the daemon (as in ``dagster-slurm dev-cluster status``) and
    ``log_tail`` holds the last lines of its log files, already included in the message.
    """

    def __init__(self, daemon: str, problem: str, log_tail: str = "") -> None:
        self.daemon = daemon
        self.problem = problem
        self.log_tail = log_tail
        message = f"{daemon}: {problem}"
        if log_tail:
            message += f"\n{log_tail}"
        super().__init__(message)
