"""The published package's ``SlurmAllocation(...)`` constructor, refused with the replacement.

The published dagster-slurm package built its allocation record as
``SlurmAllocation(slurm_job_id, nodes, working_dir, config)``. Here a
:class:`~dagster_slurm.session.core.allocation.SlurmAllocation` is a live handle that a run
session creates (with the scheduler, the session's paths and its job name) and tracks, so
that form cannot give a working object. :func:`refuse_published_allocation` recognises it
and raises a :class:`~dagster_slurm.errors.ConfigurationError` that says where to get the
allocation instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster_slurm.errors import ConfigurationError

PUBLISHED_KEYWORDS: frozenset[str] = frozenset({"slurm_job_id", "working_dir", "config"})
"""Keywords of the published constructor that today's does not have."""


def refuse_published_allocation(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigurationError` when ``SlurmAllocation(*args, **kwargs)`` is the
    published form: one of :data:`PUBLISHED_KEYWORDS` given, or a job id (an integer) as
    the first argument, where today's constructor takes the scheduler. Returns otherwise."""
    published = sorted(PUBLISHED_KEYWORDS & set(kwargs))
    positional_id = bool(args) and isinstance(args[0], int) and not isinstance(args[0], bool)
    if not published and not positional_id:
        return
    field = published[0] if published else "slurm_job_id"
    value = kwargs[field] if published else args[0]
    raise ConfigurationError(
        field, value,
        "SlurmAllocation(slurm_job_id=..., nodes=..., working_dir=..., config=...) is the "
        "published package's constructor. Here the run session creates and tracks its "
        "allocations: use compute.get_run_allocation_session(context).allocation (or "
        "SlurmSessionResource.get_session(context).allocation); its id is .job_id "
        "(.slurm_job_id reads it too). A RunSession subclass that makes allocations of "
        "its own overrides make_allocation",
    )
