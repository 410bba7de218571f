"""Errors raised by the agent client, all :class:`~dagster_slurm.errors.DagsterSlurmError`.

An operation's error reported by the agent (``{"type": ..., "message": ...}``) becomes an
:class:`AgentOpError` subclass chosen by its type; a lock timeout is also a
:class:`~dagster_slurm.errors.LockTimeout`, so callers can catch it without knowing about the
agent. A response that cannot be read at all is an :class:`AgentProtocolError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster_slurm.errors import DagsterSlurmError, LockTimeout
from dagster_slurm.transport.base import CommandResult


class AgentError(DagsterSlurmError):
    """Base class of the agent client's errors."""


class AgentProtocolError(AgentError):
    """The agent rejected the request as a whole, or its output could not be understood.

    ``result`` is the raw command result when there was one (exit code, stdout, stderr).
    """

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class AgentOpError(AgentError):
    """One operation failed on the cluster side.

    ``type`` is the agent's error type (``LockTimeout``, ``CommandTimeout``, ``BadRequest``
    ...), ``details`` the other fields of the operation's result, ``index`` its position in
    the request.
    """

    def __init__(self, type_: str, message: str, details: Mapping[str, Any], index: int) -> None:
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message
        self.details = dict(details)
        self.index = index


class AgentLockTimeout(AgentOpError, LockTimeout):
    """The state lock could not be taken in time; the message names the lock and its owner."""


class AgentCommandTimeout(AgentOpError):
    """A command run by the agent exceeded its timeout and was killed (partial output kept)."""


class OpSkipped(AgentOpError):
    """The operation was not run because an operation it ``requires`` failed."""


class SubmissionInDoubt(AgentOpError):
    """A submission record for this token exists without a job id: look the job up by token."""


class SubmitGuardFailed(AgentOpError):
    """A submission's guard did not hold under the lock: before sbatch (nothing was recorded
    or submitted), or once sbatch had queued a job (``details["job_id"]``; the agent then
    cancelled it, ``details["cancelled"]`` says whether scancel succeeded)."""

    def outcome(self) -> str:
        """What became of the submission, in words for an error message."""
        job_id = self.details.get("job_id")
        if not job_id:
            return "nothing was submitted"
        if self.details.get("cancelled"):
            return f"the job sbatch had queued meanwhile ({job_id}) was cancelled"
        return (f"the job sbatch had queued meanwhile ({job_id}) could not be cancelled: "
                f"cancel it with 'scancel {job_id}'")


class PatchRejected(AgentOpError):
    """A patch was malformed or did not fit the document (not a conflict); nothing was written."""


class DocumentError(AgentOpError):
    """A state document is missing, corrupt, or from a newer schema than this library."""


_BY_TYPE: dict[str, type[AgentOpError]] = {
    "LockTimeout": AgentLockTimeout,
    "CommandTimeout": AgentCommandTimeout,
    "Skipped": OpSkipped,
    "SubmissionInDoubt": SubmissionInDoubt,
    "SubmitGuardFailed": SubmitGuardFailed,
    "PatchError": PatchRejected,
    "DocumentMissing": DocumentError,
    "CorruptDocument": DocumentError,
    "SchemaTooNew": DocumentError,
}


def op_error(raw: Mapping[str, Any], index: int) -> AgentOpError:
    """The exception for a failed operation result ``raw`` (which has ``ok: false``)."""
    error = raw.get("error") or {}
    type_ = str(error.get("type", "Unknown"))
    message = str(error.get("message", "no message"))
    details = {k: v for k, v in raw.items() if k not in ("ok", "error")}
    return _BY_TYPE.get(type_, AgentOpError)(type_, message, details, index)
