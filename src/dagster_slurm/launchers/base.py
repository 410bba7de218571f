"""What a launcher is given and what it returns.

A launcher is pure: :meth:`ComputeLauncher.render` turns an :class:`ExecutionPlan` (the
payload's argv, the job directory, the environment, the files the script reports through)
into the complete text of a bash script, without touching the filesystem or the network.
The caller writes that text next to the payload and runs it, with ``sbatch`` in ``slurm``
mode or as a subprocess in ``local`` mode.

Everything that reaches a script is checked here first, so that bad input fails with a
:class:`~dagster_slurm.errors.ConfigurationError` naming the field before anything is
submitted: environment names must be shell identifiers, values must not contain NUL,
variables and argv words must fit Linux's limits (:mod:`dagster_slurm.slurm.exec_limits`),
paths must be absolute and free of control characters, and the drain signal must be one a
shell can trap. What passes is quoted word by word when the script is rendered
(:mod:`dagster_slurm.launchers.script`), so quotes, ``$``, backticks and newlines in values
reach the payload literally.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import shlex
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from dagster import ConfigurableResource
from pydantic import ConfigDict

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.exec_limits import (
    EXTRA_ENV_LIMIT,
    check_arguments,
    check_env_total,
    check_env_variable,
)
from dagster_slurm.slurm.validation import has_control_characters

ExecutionMode = Literal["local", "slurm"]
"""``local``: the script runs as a subprocess on this machine; ``slurm``: as a batch job."""

EXECUTION_MODES: tuple[str, ...] = ("local", "slurm")

DRAIN_SIGNALS: tuple[str, ...] = (
    "ALRM",
    "HUP",
    "INT",
    "QUIT",
    "TERM",
    "URG",
    "USR1",
    "USR2",
    "XCPU",
)
"""Signals accepted as drain signal: ones a shell can trap, given by name (their numbers
differ between Linux and macOS)."""

CANCEL_SIGNALS: tuple[str, ...] = ("TERM", "INT", "HUP")
"""Signals a job script forwards to its payload as cancellation (unless one is the drain
signal, which then counts as a drain)."""

DEFAULT_DRAIN_SIGNAL = "TERM"
"""The drain signal when none is configured (``scancel --signal=TERM`` drains on demand)."""

RESERVED_ENV_PREFIX = "__ds_"
"""Prefix of the job script's own shell variables; not allowed for environment names."""

READONLY_SHELL_VARIABLES: frozenset[str] = frozenset(
    {"BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID"}
)
"""Variables bash refuses to assign; exporting one would fail inside the script."""

SCRIPT_SUFFIXES: Mapping[str, str] = MappingProxyType({".py": "python", ".sh": "bash"})
"""How an uploaded script is run, by file suffix (``python`` may be overridden)."""

PLAN_ENV_LIMIT = EXTRA_ENV_LIMIT + 64 * 1024
"""Bytes an :class:`ExecutionPlan`'s environment may take: the user's ``extra_env`` budget
(:data:`~dagster_slurm.slurm.exec_limits.EXTRA_ENV_LIMIT`, checked first, by
``ComputeResource.run``) and room for the library's own variables (Pipes bootstrap,
``RAY_ADDRESS``)."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def validate_env(env: Mapping[str, str], *, field: str = "extra_env",
                 total_limit: int = EXTRA_ENV_LIMIT) -> dict[str, str]:
    """Check environment variables destined for a job script and return them as a dict.

    Names must be ASCII shell identifiers, not bash's read-only variables and not start with
    :data:`RESERVED_ENV_PREFIX`; values must be strings without NUL (newlines and quotes
    are fine) with a UTF-8 form. Sizes as Linux counts them
    (:mod:`dagster_slurm.slurm.exec_limits`): one ``NAME=value`` at most 128 KiB, all of
    them together at most ``total_limit`` bytes (1 MiB unless given). The error names the
    offending key, e.g. ``extra_env['MY VAR']``, or ``field`` for the total.
    """
    if not isinstance(env, Mapping):
        raise ConfigurationError(field, env, "must be a mapping of variable names to strings")
    checked: dict[str, str] = {}
    sizes: list[int] = []
    for name, value in env.items():
        where = f"{field}[{name!r}]"
        if not isinstance(name, str) or _ENV_NAME.fullmatch(name) is None:
            raise ConfigurationError(
                where, name, "is not a valid variable name; use letters, digits and '_'"
            )
        if name in READONLY_SHELL_VARIABLES:
            raise ConfigurationError(where, name, "is a read-only shell variable")
        if name.startswith(RESERVED_ENV_PREFIX):
            raise ConfigurationError(
                where, name, f"names starting with {RESERVED_ENV_PREFIX!r} are reserved"
            )
        if not isinstance(value, str):
            raise ConfigurationError(where, value, f"must be a string, got {type(value).__name__}")
        if "\0" in value:
            raise ConfigurationError(where, value, "must not contain a NUL character")
        sizes.append(check_env_variable(where, name, value))
        checked[name] = value
    check_env_total(field, checked, sizes, total_limit)
    return checked


def validate_absolute_path(field: str, value: object) -> str:
    """An absolute POSIX path without control characters (spaces and quotes are fine)."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(field, value, "must be a non-empty string")
    if not value.startswith("/"):
        raise ConfigurationError(field, value, "must be an absolute path")
    if has_control_characters(value):
        raise ConfigurationError(field, value, "must not contain control characters or newlines")
    return value


def normalize_drain_signal(field: str, value: object) -> str:
    """A drain signal by name (``USR1``, ``SIGUSR1``, ``usr1``) in the form ``USR1``.

    Numbers are refused because they differ between platforms; KILL and STOP cannot be
    trapped, so they cannot announce a drain.
    """
    if not isinstance(value, str) or not value:
        raise ConfigurationError(field, value, "must be a signal name such as 'USR1'")
    name = value.upper()
    name = name[3:] if name.startswith("SIG") else name
    if name in ("KILL", "STOP"):
        raise ConfigurationError(field, value, "cannot be trapped, so it gives no time to drain")
    if name not in DRAIN_SIGNALS:
        allowed = ", ".join(DRAIN_SIGNALS)
        raise ConfigurationError(
            field, value, f"is not a usable drain signal; use one of {allowed}"
        )
    return name


@dataclass(frozen=True, kw_only=True)
class ExecutionPlan:
    """Everything a launcher needs to write a job script.

    All paths are absolute on the machine that runs the script. ``env`` is exported before
    the activation script is sourced (Dagster Pipes bootstrap variables, the user's extra
    environment). The script writes the payload's exit status to ``status_file`` and the
    name of a received drain signal to ``drain_file``; with ``pid_file`` set it also writes
    the payload's process-group id there once the payload has started, so that a local
    caller can signal the payload directly as a last resort. Values are validated on
    construction (:class:`~dagster_slurm.errors.ConfigurationError`).
    """

    payload: tuple[str, ...]
    """The payload's argv, e.g. ``("python", "/jobs/x/payload.py")``; ``argv[0]`` is looked
    up on ``PATH`` after activation."""
    job_dir: str
    """Working directory of the script and the payload."""
    status_file: str
    """Receives the payload's exit status, one line, written atomically (temp file + rename)."""
    drain_file: str
    """Receives the name of the drain signal when one arrives."""
    mode: ExecutionMode
    """Where the script runs; see :data:`ExecutionMode`."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables exported before the payload."""
    activation: str | None = None
    """A script to ``source`` before the payload (a venv's ``bin/activate``, a site
    ``activate.sh``); None: nothing."""
    num_nodes: int = 1
    """Nodes of the allocation (launchers that span nodes use it)."""
    drain_signal: str | None = None
    """The signal that means "drain"; None: :data:`DEFAULT_DRAIN_SIGNAL`."""
    pid_file: str | None = None
    """Receives the payload's process-group id after launch; None: not written."""
    heartbeat_file: str | None = None
    """The file whose content the waiting step keeps changing (asset scope, slurm mode);
    None: no dead-man's switch. Set together with ``heartbeat_timeout``."""
    heartbeat_timeout: float | None = None
    """Seconds the content of ``heartbeat_file`` may stay unchanged before the job cancels
    itself (rounded up to whole seconds); None: no dead-man's switch."""
    restart_allowed: bool = False
    """Whether the payload may start again when Slurm restarts the job (a requeue after a
    node failure, ``scontrol requeue``; the job then sees ``SLURM_RESTART_COUNT``). False: a
    restarted job does not start the payload and ends with
    :data:`~dagster_slurm.protocol.REQUEUED_STATUS`; True: it says on stderr which start it
    is before the payload starts again."""
    array_tasks_file: str | None = None
    """A partitioned run's job array: the file with one line per task index (see
    :mod:`dagster_slurm.jobs.array_files`); the script then works in its task's directory
    below ``<job_dir>/tasks/`` (status, drain and pid files there) with the task's Pipes
    variables and ``DAGSTER_SLURM_PARTITION_KEY``. None: an ordinary job."""

    def __post_init__(self) -> None:
        payload = self.payload
        if isinstance(payload, str) or not isinstance(payload, (tuple, list)) or not payload:
            raise ConfigurationError(
                "payload", payload, "must be a non-empty sequence of argv words"
            )
        for word in payload:
            if not isinstance(word, str) or "\0" in word:
                raise ConfigurationError(
                    "payload", payload, "argv words must be strings without NUL"
                )
        if not payload[0]:
            raise ConfigurationError("payload", payload, "the program name must not be empty")
        check_arguments("payload", payload, shown=payload)
        for name in ("job_dir", "status_file", "drain_file"):
            validate_absolute_path(name, getattr(self, name))
        for name in ("activation", "pid_file", "heartbeat_file", "array_tasks_file"):
            if getattr(self, name) is not None:
                validate_absolute_path(name, getattr(self, name))
        if self.mode not in EXECUTION_MODES:
            raise ConfigurationError("mode", self.mode, "must be 'local' or 'slurm'")
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, int):
            raise ConfigurationError("num_nodes", self.num_nodes, "must be an integer")
        if self.num_nodes < 1:
            raise ConfigurationError("num_nodes", self.num_nodes, "must be at least 1")
        if self.drain_signal is not None:
            normalize_drain_signal("drain_signal", self.drain_signal)
        self._check_options()
        # Freeze the argv and the environment so that a rendered plan cannot change later.
        object.__setattr__(self, "payload", tuple(payload))
        env = validate_env(self.env, field="env", total_limit=PLAN_ENV_LIMIT)
        object.__setattr__(self, "env", MappingProxyType(env))

    def _check_options(self) -> None:
        if not isinstance(self.restart_allowed, bool):
            raise ConfigurationError("restart_allowed", self.restart_allowed, "must be True or False")
        if (self.heartbeat_file is None) != (self.heartbeat_timeout is None):
            raise ConfigurationError(
                "heartbeat_timeout", self.heartbeat_timeout,
                "needs heartbeat_file, and heartbeat_file needs it (give both or neither)",
            )
        if self.heartbeat_timeout is None:
            return
        limit = self.heartbeat_timeout
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise ConfigurationError("heartbeat_timeout", limit, "must be a positive number of seconds")
        if self.mode != "slurm":
            raise ConfigurationError(
                "heartbeat_timeout", limit, "is used in slurm mode only (the job cancels itself)"
            )

    @property
    def heartbeat_seconds(self) -> str:
        """``heartbeat_timeout`` as whole seconds for the script (``""``: no limit)."""
        if self.heartbeat_timeout is None:
            return ""
        return str(max(1, math.ceil(self.heartbeat_timeout)))

    @property
    def drain_signal_name(self) -> str:
        """The drain signal in canonical form (``USR1``), :data:`DEFAULT_DRAIN_SIGNAL` if unset."""
        if self.drain_signal is None:
            return DEFAULT_DRAIN_SIGNAL
        return normalize_drain_signal("drain_signal", self.drain_signal)


@dataclass(frozen=True)
class PayloadSpec:
    """How to run a payload, and what the caller must upload for it.

    ``argv`` is the command to put in :attr:`ExecutionPlan.payload`. When ``upload_from``
    is set, the caller must copy that local file to ``<job_dir>/<upload_name>`` before the
    script runs (``argv`` already refers to that place); when it is None, the payload is a
    command that exists where the script runs and nothing is uploaded.
    """

    argv: tuple[str, ...]
    upload_from: str | None = None
    upload_name: str | None = None

    @property
    def needs_upload(self) -> bool:
        """True when a local file has to be copied into the job directory."""
        return self.upload_from is not None


def payload_argv(payload_path: str, *, job_dir: str, python: str = "python") -> PayloadSpec:
    """Interpret a user's ``payload_path`` as a script to upload or a command to run.

    * An existing local file, or a single word ending in ``.py`` or ``.sh``, is a script:
      it is uploaded to ``job_dir`` under its base name and run as
      ``(python, <job_dir>/<name>)``, or ``("bash", <job_dir>/<name>)`` for ``.sh``. Such a
      word that names no local file is an error; to run a script already on the cluster,
      write a command instead (``"python /shared/tools/x.py"``).
    * Anything else is a command, split like a shell would (``"python -m pkg.module --x 1"``
      gives ``("python", "-m", "pkg.module", "--x", "1")``) but never run by a shell.

    ``job_dir`` is the job directory as seen by the script (absolute). Raises
    :class:`~dagster_slurm.errors.ConfigurationError` naming ``payload_path``.
    """
    if not isinstance(payload_path, str) or not payload_path.strip():
        raise ConfigurationError("payload_path", payload_path, "must be a non-empty string")
    if has_control_characters(payload_path):
        raise ConfigurationError(
            "payload_path", payload_path, "must not contain control characters or newlines"
        )
    validate_absolute_path("job_dir", job_dir)
    suffix = os.path.splitext(payload_path)[1]
    looks_like_script = suffix in SCRIPT_SUFFIXES and len(payload_path.split()) == 1
    if os.path.isfile(payload_path):
        name = os.path.basename(payload_path)
        program = "bash" if SCRIPT_SUFFIXES.get(suffix) == "bash" else python
        return PayloadSpec(
            argv=(program, posixpath.join(job_dir, name)),
            upload_from=os.path.abspath(payload_path),
            upload_name=name,
        )
    if looks_like_script:
        raise ConfigurationError(
            "payload_path",
            payload_path,
            "no such local file; to run a script that is already on the cluster, give a "
            "command such as 'python /path/on/cluster/script.py'",
        )
    try:
        argv = tuple(shlex.split(payload_path))
    except ValueError as error:
        raise ConfigurationError(
            "payload_path", payload_path, f"cannot be split: {error}"
        ) from None
    return PayloadSpec(argv=argv)


def is_shell_script(payload_path: str) -> bool:
    """Whether :func:`payload_argv` runs ``payload_path`` as a shell script: an existing
    local file whose name ends in ``.sh``, uploaded and run with ``bash``. A command such as
    ``"bash /shared/x.sh"`` is not recognised (False): what it runs is not known here."""
    if not isinstance(payload_path, str):
        return False
    suffix = os.path.splitext(payload_path)[1]
    return SCRIPT_SUFFIXES.get(suffix) == "bash" and os.path.isfile(payload_path)


class ComputeLauncher(ConfigurableResource, KnownFieldsOnly):
    """Base of the launchers: configuration in, job script text out.

    Launchers are Dagster resources so that they can be set as a default on a compute
    resource and replaced per asset. Unknown fields are rejected. Subclasses implement
    :meth:`render`, which must be pure (no I/O) and must quote every value it writes.
    """

    model_config = ConfigDict(extra="forbid")

    def payload_opens_pipes(self, payload_path: str) -> bool:
        """Whether the payload named by ``payload_path`` is expected to open Dagster Pipes.

        False for a shell script (:func:`is_shell_script`): it talks to Dagster through its
        output only, so a run in which no Pipes message arrived is normal for it and is not
        warned about. True for everything else (Python scripts, commands), so that a payload
        that should have opened Pipes and did not still gets Dagster's warning.
        """
        return not is_shell_script(payload_path)

    @abstractmethod
    def render(self, plan: ExecutionPlan) -> str:
        """The complete text of the job script (``#!/bin/bash`` first) that runs ``plan``."""
