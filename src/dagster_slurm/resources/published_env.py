"""Environment variables of the published dagster-slurm 1.x package, read by ``from_env``.

The published package's ``SlurmResource.from_env()`` read the SSH settings from
``SLURM_SSH_*``, the base path from ``SLURM_REMOTE_BASE`` and the queue defaults from
``SLURM_TIME``, ``SLURM_CPUS``, ``SLURM_MEM`` and others. This module lets
:meth:`SlurmResource.from_env <dagster_slurm.resources.slurm.SlurmResource.from_env>` and
:meth:`SSHConnectionResource.from_env
<dagster_slurm.resources.ssh.SSHConnectionResource.from_env>` read them where this library
has no variable of another meaning:

* a renamed variable (``SLURM_REMOTE_BASE``, ``<prefix>KNOWN_HOSTS_FILE``,
  ``<prefix>JUMP_KEY``, the whole ``SLURM_SSH_`` prefix) is read for today's name with a
  :class:`DeprecationWarning` naming it; both names set at once is a
  :class:`~dagster_slurm.errors.ConfigurationError` naming both;
* the queue variables (:data:`QUEUE_VARIABLES`), which have no other name here, are read
  without a warning; a bad value is refused naming the variable. Inside a Slurm job
  (``SLURM_JOB_ID`` set) the ones Slurm itself sets for the job
  (:data:`SET_BY_SLURM_IN_A_JOB`) describe that job, not the configuration, and are not read;
* SSH variables without an equivalent (:data:`IGNORED_SSH_VARIABLES`) are ignored with a
  warning saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster_slurm.config_errors import warn_at_caller, warn_renamed
from dagster_slurm.errors import ConfigurationError

DEFAULT_SSH_PREFIX = "SLURM_EDGE_NODE_"
"""This library's prefix of the SSH variables."""

PUBLISHED_SSH_PREFIX = "SLURM_SSH_"
"""The published package's default prefix of the SSH variables."""

RENAMED_SSH_SUFFIXES: Mapping[str, str] = {
    "KNOWN_HOSTS_FILE": "KNOWN_HOSTS",
    "JUMP_KEY": "JUMP_KEY_PATH",
}
"""Published SSH variable suffix -> this library's suffix of the same meaning."""

IGNORED_SSH_VARIABLES: Mapping[str, str] = {
    "FORCE_TTY": "commands never need a terminal here",
    "BATCH_MODE": "the connection never prompts (use ssh-agent for keys with a passphrase)",
    "OPTS_EXTRA": "there are no raw OpenSSH options (the connection does not use OpenSSH)",
    "POST_LOGIN_COMMAND": "there is no post-login command (use jump_host for a bastion)",
}
"""Published SSH variable suffixes without an equivalent, with the reason."""

REMOTE_BASE_VARIABLE = "SLURM_DEPLOYMENT_BASE_PATH"
PUBLISHED_REMOTE_BASE_VARIABLE = "SLURM_REMOTE_BASE"

QUEUE_VARIABLES: Mapping[str, str] = {
    "SLURM_PARTITION": "partition",
    "SLURM_TIME": "time_limit",
    "SLURM_CPUS": "cpus",
    "SLURM_MEM": "mem",
    "SLURM_MEM_PER_CPU": "mem_per_cpu",
    "SLURM_NUM_NODES": "num_nodes",
    "SLURM_GPUS_PER_NODE": "gpus_per_node",
    "SLURM_QOS": "qos",
    "SLURM_RESERVATION": "reservation",
    "SLURM_ACCOUNT": "account",
    "SLURM_SIGNAL_BEFORE_TIMEOUT": "signal_before_timeout",
}
"""Variable -> :class:`~dagster_slurm.slurm.queue.SlurmQueueConfig` field, read when
``from_env`` is given no queue."""

_WHOLE_NUMBERS = frozenset({"cpus", "num_nodes", "gpus_per_node"})

SET_BY_SLURM_IN_A_JOB: frozenset[str] = frozenset({"SLURM_MEM_PER_CPU", "SLURM_GPUS_PER_NODE"})
"""Queue variables that Slurm sets in a job's environment (for that job's own request)."""

IGNORED_VARIABLES: Mapping[str, str] = {
    "SLURM_STATUS_POLL_INTERVAL": "SlurmResource.status_max_age and the poll intervals of "
    "ComputeResource decide how often job states are read",
    "SLURM_STATUS_POLL_MAX_INTERVAL": "see SLURM_STATUS_POLL_INTERVAL",
    "SLURM_STATUS_POLL_BACKOFF": "see SLURM_STATUS_POLL_INTERVAL",
}
"""Published variables of SlurmResource.from_env without an equivalent, with the reason."""


def _set(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value else None


def _ignored(name: str, value: str, reason: str) -> None:
    warn_at_caller(f"{name}={value!r} is ignored: {reason}")


def _renamed(env: dict[str, str], old: str, new: str, advised: str | None = None) -> None:
    """Read ``old`` as ``new`` in ``env`` (in place), warning that ``advised`` (``new``
    unless given) is the name to use; both set is an error."""
    value = _set(env, old)
    if value is None:
        return
    if _set(env, new) is not None:
        raise ConfigurationError(
            old, value, f"set together with {new}; {old} is the published package's name of "
            f"{new}: set only {new}",
        )
    warn_renamed(f"environment variable {old}", advised or new)
    env[new] = value


def ssh_environment(env: Mapping[str, str], stem: str) -> tuple[dict[str, str], str]:
    """``(variables, stem)`` for reading the SSH settings with prefix ``stem``: the
    published package's names read for ours (see the module documentation). With the
    default prefix and no ``SLURM_EDGE_NODE_HOST``, a set ``SLURM_SSH_HOST`` selects the
    published prefix (with a warning); both set is an error naming both."""
    out = dict(env)
    advised = stem  # the prefix the warnings tell the user to use
    if stem == DEFAULT_SSH_PREFIX and _set(out, PUBLISHED_SSH_PREFIX + "HOST") is not None:
        ours, theirs = DEFAULT_SSH_PREFIX + "HOST", PUBLISHED_SSH_PREFIX + "HOST"
        if _set(out, ours) is not None:
            raise ConfigurationError(
                theirs, out[theirs], f"set together with {ours}; {PUBLISHED_SSH_PREFIX}* are "
                f"the published package's names of {DEFAULT_SSH_PREFIX}*: set only those",
            )
        warn_renamed(f"the environment variable prefix {PUBLISHED_SSH_PREFIX}", DEFAULT_SSH_PREFIX)
        stem = PUBLISHED_SSH_PREFIX
    for old, new in RENAMED_SSH_SUFFIXES.items():
        _renamed(out, stem + old, stem + new, advised + new)
    for prefix in (stem, stem + "JUMP_"):
        for suffix, reason in IGNORED_SSH_VARIABLES.items():
            value = _set(out, prefix + suffix)
            if value is not None:
                _ignored(prefix + suffix, value, reason)
    return out, stem


def remote_base(env: Mapping[str, str]) -> tuple[str | None, str]:
    """``(remote_base, variable)``: the value of ``SLURM_DEPLOYMENT_BASE_PATH`` or, with a
    warning, of the published ``SLURM_REMOTE_BASE`` (None when neither is set), and the
    name of the variable it came from."""
    out = dict(env)
    _renamed(out, PUBLISHED_REMOTE_BASE_VARIABLE, REMOTE_BASE_VARIABLE)
    if _set(env, PUBLISHED_REMOTE_BASE_VARIABLE) is not None:
        return out[REMOTE_BASE_VARIABLE], PUBLISHED_REMOTE_BASE_VARIABLE
    return _set(out, REMOTE_BASE_VARIABLE), REMOTE_BASE_VARIABLE


def queue_values(env: Mapping[str, str]) -> dict[str, Any]:
    """The :class:`SlurmQueueConfig` fields set by :data:`QUEUE_VARIABLES` in ``env``
    (a whole number checked here, naming the variable); warns about
    :data:`IGNORED_VARIABLES` that are set."""
    in_job = _set(env, "SLURM_JOB_ID") is not None
    values: dict[str, Any] = {}
    for name, field in QUEUE_VARIABLES.items():
        raw = _set(env, name)
        if raw is None or (in_job and name in SET_BY_SLURM_IN_A_JOB):
            continue
        if field in _WHOLE_NUMBERS:
            if not raw.strip().isdigit():
                raise ConfigurationError(name, raw, "must be a whole number")
            values[field] = int(raw)
        else:
            values[field] = raw.strip()
    for name, reason in IGNORED_VARIABLES.items():
        value = _set(env, name)
        if value is not None:
            _ignored(name, value, reason)
    return values


def variable_of(field: str) -> str:
    """The variable that sets queue field ``field``."""
    return next(name for name, target in QUEUE_VARIABLES.items() if target == field)
