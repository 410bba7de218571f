"""Worker intents: how many worker allocations of one shape an application wants.

:class:`WorkerIntent` is the input of :meth:`RunSession.reconcile_workers`, and
:class:`ReconcileResult` its answer. The decision itself is
:func:`~dagster_slurm.session.scaling.plan.plan_reconcile` (pure); the I/O around it is
:mod:`dagster_slurm.session.scaling.reconcile`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig

#: Seconds a released worker allocation drains when its intent does not say.
DEFAULT_DRAIN_TIMEOUT = 600.0
#: Seconds an observation passed as ``observed`` may be old before nothing is submitted.
DEFAULT_MAX_OBSERVATION_AGE = 300.0

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _seconds(name: str, value: object, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value >= 0):
        raise ConfigurationError(name, value, "must be a finite number of seconds, 0 or more"
                                 + (" (or None)" if allow_none else ""))
    return float(value)


@dataclass(frozen=True, kw_only=True)
class WorkerIntent:
    """A group of worker allocations and how many of them should be pending or running.

    ``key`` names the group (letters, digits, ``.``, ``_``, ``-``; at most 64 characters):
    the allocations :meth:`~dagster_slurm.session.session.RunSession.reconcile_workers` submits for it carry it, and only
    they count toward ``count`` and are released by it. ``config`` is the shape submitted
    (None: the shape inherited like ``add_worker_allocation(SlurmWorkerAllocationConfig())``,
    from the session's first worker allocation, else the head). ``drain_timeout`` is how long
    a released allocation drains before it is stopped (None: until 15 s before its own
    walltime, as far as the scheduler says how much is left; else 600 s). With
    ``pending_timeout`` an allocation this intent submitted that is still pending that many
    seconds after its submission is cancelled, and not replaced in the same call.
    """

    key: str
    count: int
    config: SlurmWorkerAllocationConfig | None = None
    drain_timeout: float | None = DEFAULT_DRAIN_TIMEOUT
    pending_timeout: float | None = None

    def __post_init__(self) -> None:
        check_key(self.key)
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ConfigurationError("count", self.count, "must be a whole number, 0 or more")
        if self.config is not None and not isinstance(self.config, SlurmWorkerAllocationConfig):
            raise ConfigurationError("config", self.config,
                                     "must be a SlurmWorkerAllocationConfig or None")
        object.__setattr__(self, "drain_timeout",
                           _seconds("drain_timeout", self.drain_timeout, allow_none=True))
        object.__setattr__(self, "pending_timeout",
                           _seconds("pending_timeout", self.pending_timeout, allow_none=True))


@dataclass(frozen=True)
class ReconcileResult:
    """What one :meth:`~dagster_slurm.session.session.RunSession.reconcile_workers` call did.

    Job ids are Slurm job ids. ``submitted``: allocations submitted by this call.
    ``released``: allocations whose release started in this call (their drain deadline was
    persisted; a pending one was cancelled). ``live``: the intent's allocations that count
    toward ``count`` after the call (pending or running, not released, including those just
    submitted). ``held_back``: why nothing, or less than ``count`` asked for, was submitted,
    and what else was left alone (one sentence each; empty when nothing was held back).
    ``recovered``: allocations of the intent whose submission had been interrupted before
    its job id was recorded, found by their token in this call. ``cancelled``: allocations
    cancelled in this call (pending ones released, drains past their deadline, pending ones
    past ``pending_timeout``). ``ended``: allocations recorded released because their job
    had ended.
    """

    submitted: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    live: tuple[str, ...] = ()
    held_back: tuple[str, ...] = ()
    recovered: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()
    ended: tuple[str, ...] = ()


def check_key(key: object) -> str:
    """An intent's ``key``: 1-64 letters, digits, ``.``, ``_`` or ``-``, starting with a
    letter or digit."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise ConfigurationError("key", key, "must be 1-64 characters of letters, digits, "
                                 "'.', '_' or '-', starting with a letter or digit")
    return key


def check_release(release: object) -> tuple[str, ...]:
    """``release=`` of ``reconcile_workers`` as job id strings (None: none)."""
    if release is None:
        return ()
    if isinstance(release, str | bytes) or not hasattr(release, "__iter__"):
        raise ConfigurationError("release", release, "must be a list of Slurm job ids")
    ids = []
    for item in release:  # type: ignore[attr-defined]
        text = str(item).strip()
        if isinstance(item, bool) or not text.isdigit():
            raise ConfigurationError("release", release,
                                     f"{item!r} is not a Slurm job id (digits only)")
        ids.append(text)
    return tuple(dict.fromkeys(ids))


def check_budget(max_submissions: object) -> int | None:
    """``max_submissions=`` of ``reconcile_workers`` (None: no limit beyond ``count``)."""
    if max_submissions is None:
        return None
    if isinstance(max_submissions, bool) or not isinstance(max_submissions, int) or (
            max_submissions < 0):
        raise ConfigurationError("max_submissions", max_submissions,
                                 "must be a whole number, 0 or more (or None)")
    return max_submissions
