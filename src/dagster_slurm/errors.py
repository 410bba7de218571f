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


MESSAGE_VALUE_LIMIT = 200
"""Longest ``repr`` of a value a :class:`ConfigurationError` message shows in full."""


def shown_value(value: object) -> str:
    """``repr(value)`` for a message; cut to its start, with the size, when it is longer
    than :data:`MESSAGE_VALUE_LIMIT` (a 200 KB string must not make a 200 KB message)."""
    text = repr(value)
    if len(text) <= MESSAGE_VALUE_LIMIT:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as text"
    return f"{text[:80]}... ({size})"


class ConfigurationError(DagsterSlurmError, ValueError):
    """A configuration value is invalid; raised before anything is submitted.

    ``field`` names the offending field and ``value`` holds what was given (the message
    shows it through :func:`shown_value`).
    """

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}={shown_value(value)}: {problem}")


class TransportError(DagsterSlurmError):
    """The connection to the cluster failed (connect, authentication, dropped link, timeout)."""


class AuthenticationFailed(TransportError):
    """The login node refused the login, or the credentials cannot be used (a missing,
    unreadable or passphrase-protected key file, nothing to log in with). Not retried:
    repeated failed logins can get an account banned."""


class CertificateError(AuthenticationFailed):
    """The OpenSSH certificate next to the key (``<key_path>-cert.pub``) cannot be used:
    expired, not yet valid, unreadable, or its renewal command failed or left no valid
    certificate. Raised before any connection is attempted; not retried."""


class LoginRequired(AuthenticationFailed):
    """Logging in needs a person (a one-time code, a password nobody configured, a shared
    login that is not up or has ended). Raised at once in a process that has no terminal of
    its own to ask on; the message names the host and the ``dagster-slurm login`` command
    to run on this machine. Nothing on the cluster is cancelled because of it."""


class RemoteProgramEnded(TransportError):
    """The long-lived command of a stream had ended when a request was written to it, while
    the connection itself is up. The request did not reach it (a program that has ended
    reads nothing), so sending it to a new process is safe."""


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


class SubmitLimitReached(SchedulerError):
    """sbatch refused a job because a limit on the user's (or account's, or QOS's) queued
    jobs is reached; submitting again after one of them ended will work. ``refusal`` is the
    classified limit (a :class:`~dagster_slurm.slurm.submit_limits.SubmitRefusal`)."""

    def __init__(self, message: str, refusal: object) -> None:
        super().__init__(message)
        self.refusal = refusal


class SubmitLimitTimeout(SchedulerError):
    """A submission waited for a free slot under a submission limit longer than
    ``SlurmResource.submit_limit_timeout`` allows; nothing was submitted."""
