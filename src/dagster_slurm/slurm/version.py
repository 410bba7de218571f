"""The cluster's Slurm release, and which options of the scheduler commands it offers.

Pure: text in, values out. :class:`SlurmVersion` is read from the ``--version`` line of any
Slurm client command (``slurm 24.11.5``; Debian prints ``slurm-wlm 22.05.8``), once per
connection (see :class:`~dagster_slurm.agent.client.AgentClient`). Command builders take a
version and use what that release offers (:class:`SlurmFeature`); ``None`` (not known yet)
builds for :data:`BASELINE`, the oldest release the library supports, whose commands are
the ones every later release accepts as well.

Release facts behind :data:`FEATURE_RANGES` (from Slurm's changelogs and option tables):

* ``squeue --only-job-state`` was added in 23.11.5: the controller answers with job id and
  state only (a lighter RPC; with ``SchedulerParameters=enable_job_state_cache`` from a
  cache without the job lock). Every other column is then empty or meaningless, job names
  and users cannot filter (25.05 refuses such combinations outright), ids can, and an id
  the controller no longer knows is simply not listed (no error). 26.05 removed the job
  state cache, so the library stops using the option there.
* ``sacct``'s ``Planned`` column (seconds the job waited while eligible) exists from 23.02
  (22.05 calls it ``Reserved``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "BASELINE",
    "FEATURE_RANGES",
    "SlurmFeature",
    "SlurmVersion",
    "VERSION_ARGV",
    "parse_slurm_version",
]

#: The command whose output :func:`parse_slurm_version` reads: no RPC, answered by the
#: client binary itself (a few milliseconds on the login node).
VERSION_ARGV: tuple[str, ...] = ("squeue", "--version")

_VERSION = re.compile(r"\s*(?:slurm(?:-wlm)?\s+)?([0-9]{2})\.([0-9]{2})(?:\.([0-9]{1,3}))?(?![0-9.])")


@dataclass(frozen=True, order=True)
class SlurmVersion:
    """A Slurm release ``major.minor.micro`` (``24.11.5``); ordered like the releases."""

    major: int
    """Year of the release series (``24``)."""
    minor: int
    """Month of the release series (``11``)."""
    micro: int = 0
    """Maintenance release within the series."""

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}.{self.micro}"

    @property
    def series(self) -> str:
        """``major.minor`` as Slurm names its release series (``24.11``)."""
        return f"{self.major:02d}.{self.minor:02d}"

    def offers(self, feature: SlurmFeature) -> bool:
        """Whether this release has ``feature`` (see :data:`FEATURE_RANGES`)."""
        since, until = FEATURE_RANGES[feature]
        return since <= self and (until is None or self < until)


class SlurmFeature(Enum):
    """A scheduler option the library uses only on the releases that have it."""

    ONLY_JOB_STATE = "squeue --only-job-state"
    """Job id and state only, by job id: the running-phase state poll."""
    SACCT_PLANNED = "sacct Planned column"
    """Seconds a job waited while eligible to start."""


#: ``feature -> (first release with it, first release without it again or None)``.
FEATURE_RANGES: dict[SlurmFeature, tuple[SlurmVersion, SlurmVersion | None]] = {
    SlurmFeature.ONLY_JOB_STATE: (SlurmVersion(23, 11, 5), SlurmVersion(26, 5, 0)),
    SlurmFeature.SACCT_PLANNED: (SlurmVersion(23, 2, 0), None),
}

#: The oldest supported release; builders given no version build for it.
BASELINE = SlurmVersion(22, 5, 0)


def parse_slurm_version(text: object) -> SlurmVersion | None:
    """The release in a ``--version`` line (``slurm 24.11.5``, ``slurm-wlm 22.05.8``,
    ``slurm 25.05.0-0rc1``) or a bare ``24.11.5``; None when there is none. Never raises."""
    if not isinstance(text, str):
        return None
    match = _VERSION.match(text)
    if match is None:
        return None
    major, minor, micro = match.groups()
    if not 1 <= int(minor) <= 12:
        return None
    return SlurmVersion(int(major), int(minor), int(micro or 0))


def offers(version: SlurmVersion | None, feature: SlurmFeature) -> bool:
    """``version.offers(feature)``; False for an unknown version (``None``)."""
    return version is not None and version.offers(feature)
