"""Exception hierarchy of dagster-slurm.

Every error the library raises on purpose derives from :class:`DagsterSlurmError`, so a
caller can catch the library's failures without catching programming errors.
"""

from __future__ import annotations

from typing import Protocol


class CommandOutput(Protocol):
    """What :class:`CommandFailed` reads of a finished command: a
    :class:`~dagster_slurm.transport.base.CommandResult` (named here by its shape, so that
    this lowest module imports nothing of the library)."""

    @property
    def command(self) -> str: ...

    @property
    def exit_code(self) -> int: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class DagsterSlurmError(Exception):
    """Base class of every error raised by dagster-slurm."""


class ConfigurationError(DagsterSlurmError, ValueError):
    """A configuration value is invalid; raised before anything is submitted.

    ``field`` names the offending field and ``value`` holds what was given.
    """

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}={value!r}: {problem}")


class TransportError(DagsterSlurmError):
    """The connection to the cluster failed (connect, authentication, dropped link, timeout)."""


class HostKeyError(TransportError):
    """The server's host key is unknown or does not match the known_hosts entry."""


class CommandTimeout(TransportError):
    """A remote command did not finish within its timeout."""


class CommandFailed(DagsterSlurmError):
    """A command ran but exited non-zero; carries the full :class:`CommandResult`."""

    def __init__(self, result: CommandOutput, what: str | None = None) -> None:
        self.result = result
        head = what or f"command {result.command!r}"
        tail = (result.stderr or result.stdout).strip()[-2000:]
        super().__init__(f"{head} exited with code {result.exit_code}: {tail}")


class LockTimeout(DagsterSlurmError):
    """The session lock could not be taken in time; the message names the lock and its owner."""


class SchedulerError(DagsterSlurmError):
    """The scheduler rejected or failed a request (sbatch, squeue, scancel ...)."""
