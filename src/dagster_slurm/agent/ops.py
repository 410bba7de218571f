"""Typed builders for the agent's operations.

Each builder returns an :class:`AgentOp`: the JSON parameters sent to the agent, a decoder for
the answer, and a time budget (the longest the operation may take on the cluster, used to
bound the round trip). Run one with :meth:`AgentClient.run` or several in one round trip with
:meth:`AgentClient.batch`.

Decoding raises the matching :class:`~dagster_slurm.agent.exceptions.AgentOpError` for a
failed operation, except for outcomes that are part of an operation's normal contract:
a transaction conflict (``TxnResult.ok`` False) and a failed submission
(``SubmitResult.status`` ``failed``/``unknown``).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dagster_slurm.agent.exceptions import op_error
from dagster_slurm.agent.results import (
    ExecResult,
    JobStatusResult,
    ObserveResult,
    PathResult,
    ReadResult,
    ScanResult,
    SubmitResult,
    TailRequest,
    TailResult,
    TxnResult,
)

R = TypeVar("R")
_SHORT_BUDGET = 30.0


@dataclass(frozen=True)
class AgentOp(Generic[R]):
    """One agent operation: ``name``, ``params``, its decoder and its time budget (seconds)."""

    name: str
    params: Mapping[str, Any]
    decoder: Callable[[Mapping[str, Any]], R]
    budget_s: float = _SHORT_BUDGET
    accepted_errors: tuple[str, ...] = ()

    def to_request(self, requires: Sequence[int] = ()) -> dict[str, Any]:
        """The JSON object sent to the agent."""
        request = {"op": self.name, **self.params}
        if requires:
            request["requires"] = list(requires)
        return request

    def decode(self, raw: Mapping[str, Any], index: int) -> R:
        """The typed result, or raise the operation's error."""
        if raw.get("ok") or _error_type(raw) in self.accepted_errors:
            return self.decoder(raw)
        raise op_error(raw, index)


def _error_type(raw: Mapping[str, Any]) -> str | None:
    error = raw.get("error")
    return error.get("type") if isinstance(error, Mapping) else None


def exec_op(
    argv: Sequence[str],
    *,
    stdin: str | bytes | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    check: bool = False,
) -> AgentOp[ExecResult]:
    """Run ``argv`` (no shell). A non-zero exit raises only with ``check=True``."""
    params: dict[str, Any] = {"argv": list(argv), "timeout": timeout, "check": check}
    if isinstance(stdin, bytes):
        params["stdin_b64"] = base64.b64encode(stdin).decode("ascii")
    elif stdin is not None:
        params["stdin"] = stdin
    if env:
        params["env"] = dict(env)
    if cwd is not None:
        params["cwd"] = cwd
    return AgentOp("exec", params, ExecResult.from_raw, timeout + 5.0)


def txn_op(
    path: str,
    lock: str,
    patch: Sequence[Mapping[str, Any]],
    *,
    lock_timeout: float = 30.0,
    create: Mapping[str, Any] | None = None,
    max_schema_version: int | None = None,
    dir_mode: int = 0o700,
) -> AgentOp[TxnResult]:
    """Apply ``patch`` to the document at ``path`` under ``lock`` (see the agent's ``txn``).

    With ``create``, missing directories of ``path`` and ``lock`` are made with
    ``dir_mode`` (private by default; 0o755 for documents shared on purpose).
    """
    params = {
        "path": path,
        "lock": lock,
        "patch": [dict(op) for op in patch],
        "timeout": lock_timeout,
        "create": None if create is None else dict(create),
        "max_schema_version": max_schema_version,
        "dir_mode": dir_mode,
    }
    return AgentOp("txn", params, TxnResult.from_raw, lock_timeout + 10.0, ("Conflict",))


def read_op(path: str) -> AgentOp[ReadResult]:
    """Read the document at ``path`` without the lock."""
    return AgentOp("read", {"path": path}, ReadResult.from_raw)


@dataclass(frozen=True)
class ScanSpec:
    """Documents called ``name`` exactly ``depth`` levels below ``root`` (``depth`` 2:
    ``<root>/<dir>/<name>``); with ``sibling``, also the first bytes of the file of that name
    next to each."""

    root: str
    name: str
    depth: int
    sibling: str | None = None


def scan_op(specs: Sequence[ScanSpec], *, sibling_bytes: int = 256) -> AgentOp[ScanResult]:
    """Find and read documents below several roots in one operation (no lock taken)."""
    params = {
        "scan": [{"root": s.root, "name": s.name, "depth": s.depth, "sibling": s.sibling}
                 for s in specs],
        "sibling_bytes": sibling_bytes,
    }
    return AgentOp("scan", params, ScanResult.from_raw)


def tail_op(files: Sequence[TailRequest]) -> AgentOp[TailResult]:
    """Read new bytes of several files, each from its own offset."""
    params = {
        "files": [{"path": f.path, "offset": f.offset, "max_bytes": f.max_bytes} for f in files]
    }
    return AgentOp("tail", params, TailResult.from_raw)


@dataclass(frozen=True)
class SharedSqueue:
    """Where a status poll finds the user's shared squeue answer on the login node.

    ``path``: the answer's file (in the deployment base, one per user); ``argv``: the squeue
    that lists every job of the user (its output is what the file holds); ``max_age``:
    seconds an answer may be old to serve a poll whose jobs it all lists (0: only an answer
    taken after the poll started); ``floor`` and ``client``: a poll that needs a newer
    answer waits until ``floor`` s after another client's refresh (see the agent's
    ``status_cache`` module).
    """

    path: str
    argv: tuple[str, ...]
    max_age: float
    all_jobs: bool = False
    """Answer with every job of the user, not only the known ids' lines."""
    floor: float = 0.0
    """Least seconds between a refresh by another process and one for this poll."""
    client: str | None = None
    """This poller's id (one per scheduler client): its own last refresh sets no floor."""


def job_status_op(
    squeue_argv: Sequence[str],
    known_ids: Sequence[str],
    *,
    sacct_argv: Sequence[str] | None = None,
    status_files: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    shared: SharedSqueue | None = None,
) -> AgentOp[JobStatusResult]:
    """One squeue call, status files, and one sacct call for known ids squeue no longer lists.

    The squeue format must print the job id as the first ``|``-separated field. With
    ``shared``, the squeue answer is the user's shared one (``shared.argv`` instead of
    ``squeue_argv``; see :class:`SharedSqueue`).
    """
    params: dict[str, Any] = {
        "squeue_argv": list(squeue_argv),
        "known_ids": [str(i) for i in known_ids],
        "sacct_argv": None if sacct_argv is None else list(sacct_argv),
        "status_files": dict(status_files or {}),
        "timeout": timeout,
    }
    if shared is not None:
        params["shared"] = {"path": shared.path, "argv": list(shared.argv),
                            "max_age": shared.max_age, "wait": timeout + 5.0,
                            "all_jobs": shared.all_jobs, "floor": shared.floor,
                            "client": shared.client}
    return AgentOp("job_status", params, JobStatusResult.from_raw, 2 * timeout + 5.0)


def observe_session_op(
    path: str,
    squeue_argv: Sequence[str],
    *,
    sacct_argv: Sequence[str] | None = None,
    jobs_dir: str = "",
    job_files: Sequence[str] = (),
    files: Sequence[str] = (),
    timeout: float = 60.0,
) -> AgentOp[ObserveResult]:
    """The session document at ``path``, one squeue, sacct for the known jobs squeue no longer
    lists, and the files ``<jobs_dir>/<job id>/<name>`` (``job_files``) of every known job plus
    ``files``: see the agent's ``observe_session``."""
    params = {
        "path": path,
        "squeue_argv": list(squeue_argv),
        "sacct_argv": None if sacct_argv is None else list(sacct_argv),
        "jobs_dir": jobs_dir,
        "job_files": list(job_files),
        "files": list(files),
        "timeout": timeout,
    }
    return AgentOp("observe_session", params, ObserveResult.from_raw, 2 * timeout + 5.0)


def submit_op(
    argv: Sequence[str],
    *,
    token: str,
    state_path: str,
    lock_path: str,
    record: str,
    record_value: Mapping[str, Any] | None = None,
    lock_timeout: float = 30.0,
    timeout: float = 120.0,
    create: Mapping[str, Any] | None = None,
    max_schema_version: int | None = None,
    on_submitted: tuple[str, Mapping[str, Any]] | None = None,
    guards: Sequence[Mapping[str, Any]] = (),
    release_on: Sequence[str] = (),
) -> AgentOp[SubmitResult]:
    """Record ``token`` at pointer ``record``, run ``argv`` (sbatch) unlocked, record the outcome.

    ``argv`` must contain the token (``--comment=<token>``), so an interrupted submission can
    be found in squeue's comment column. ``on_submitted=(path_template, value)``, e.g.
    ``("/workers/{job_id}", {"intent": "gpu"})``, also writes the job's own record in the
    transaction that records the job id. ``guards`` (``test``/``absent`` operations) must
    hold in the transaction that records the token, else nothing is written or submitted
    (:class:`~dagster_slurm.agent.exceptions.SubmitGuardFailed`). A refusal whose output
    contains one of ``release_on`` removes the record instead of marking it failed (the
    caller waits it out and submits the token again).
    """
    params = {
        "argv": list(argv),
        "token": token,
        "record": record,
        "record_value": dict(record_value or {}),
        "timeout": timeout,
        "on_submitted": None
        if on_submitted is None
        else {"path": on_submitted[0], "value": dict(on_submitted[1])},
        "guards": [dict(guard) for guard in guards],
        "release_on": list(release_on),
        "state": {
            "path": state_path,
            "lock": lock_path,
            "timeout": lock_timeout,
            "create": None if create is None else dict(create),
            "max_schema_version": max_schema_version,
        },
    }
    budget = 2 * lock_timeout + timeout + 10.0
    return AgentOp("submit", params, SubmitResult.from_raw, budget, ("SubmitFailed",))


def write_file_op(
    path: str,
    content: str | bytes,
    *,
    mode: int = 0o600,
    makedirs: bool = False,
    dir_mode: int = 0o700,
    wake: str | None = None,
) -> AgentOp[PathResult]:
    """Write ``content`` to ``path`` atomically with exactly ``mode``.

    Private by default: the file gets 0o600 and, with ``makedirs``, each missing parent
    directory is created with ``dir_mode`` (0o700), so that what the library writes (job
    scripts, environment files, Pipes context) is readable by its owner only. Pass
    0o644/0o755 for files shared with other users on purpose.

    ``wake``: a FIFO to write one newline to once the file is written (a step server's wake
    FIFO), opened non-blocking; no reader (none on the login node's host), a missing FIFO or
    a full pipe never fail the write (``PathResult.woken`` says whether a reader got it).
    None: no wake-up.
    """
    params: dict[str, Any] = {
        "path": path, "mode": mode, "makedirs": makedirs, "dir_mode": dir_mode,
    }
    if wake is not None:
        params["wake"] = wake
    if isinstance(content, bytes):
        params["content_b64"] = base64.b64encode(content).decode("ascii")
    else:
        params["content"] = content
    return AgentOp("write_file", params, PathResult.from_raw)


def mkdir_op(path: str, *, mode: int = 0o755) -> AgentOp[PathResult]:
    """Create ``path`` and missing parents, each with exactly ``mode``; ``changed`` is
    False when it existed."""
    return AgentOp("mkdir", {"path": path, "mode": mode}, PathResult.from_raw)


def remove_op(path: str, *, root: str) -> AgentOp[PathResult]:
    """Remove a file or tree strictly inside ``root``; ``changed`` is False when it was missing."""
    return AgentOp("remove", {"path": path, "root": root}, PathResult.from_raw, 120.0)
