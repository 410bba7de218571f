"""The ``--array`` value of a job array and the site's limit on arrays (pure).

An ``--array`` value lists task indices and ranges, comma separated (``0-4,7,9-12``), and may
end in ``%P``: at most P tasks of the array run at once. ``MaxArraySize``
(``scontrol show config``) bounds the task *index*: indices run from 0 to
``MaxArraySize - 1``; 0 means the site allows no arrays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dagster_slurm.errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_ARRAY_SIZE", "ArrayChunk", "array_expression", "max_array_size",
    "parse_array_expression", "split_for_arrays", "validate_array_expression",
    "validate_array_parallelism",
]

#: Slurm's default ``MaxArraySize``: task indices 0 to 1000.
DEFAULT_MAX_ARRAY_SIZE = 1001

_NUMBER = re.compile(r"[0-9]+")
_EXPRESSION = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*(?:%[0-9]+)?")
_EXAMPLES = "task indices and ranges such as '0-99' or '0-4,7%3'"


def validate_array_parallelism(field: str, value: object) -> int | None:
    """``value`` as an ``--array`` throttle (the most tasks of one array running at once):
    None (no limit but the scheduler's), or a whole number of at least 1 (True and False
    are refused). Raises :class:`~dagster_slurm.errors.ConfigurationError` naming ``field``
    and ``value`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(field, value, "must be a whole number of at least 1, or None")
    return value


def array_expression(indices: Iterable[int], parallelism: int | None = None) -> str:
    """The ``--array`` value for ``indices`` (sorted, duplicates dropped, runs of
    consecutive indices written as ranges: ``0-4,7,9-12``), followed by ``%parallelism``
    when given (at most that many tasks run at once; None: no such limit).

    Raises :class:`~dagster_slurm.errors.ConfigurationError` for no indices or a negative
    one (field ``indices``) and for ``parallelism`` below 1 (field ``array_parallelism``).
    """
    unique = sorted(set(indices))
    if not unique:
        raise ConfigurationError("indices", unique, "a job array needs at least one task")
    if unique[0] < 0:
        raise ConfigurationError("indices", unique[0], "task indices must not be negative")
    validate_array_parallelism("array_parallelism", parallelism)
    parts: list[str] = []
    start = previous = unique[0]
    for index in [*unique[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if index is not None:
            start = previous = index
    text = ",".join(parts)
    return f"{text}%{parallelism}" if parallelism is not None else text


def validate_array_expression(field: str, value: object) -> str:
    """``value`` checked as an ``--array`` value: indices and ``N-M`` ranges (N <= M),
    comma separated, then an optional ``%P`` with P >= 1. Raises
    :class:`~dagster_slurm.errors.ConfigurationError` naming ``field`` and ``value``
    otherwise."""
    if not isinstance(value, str) or not _EXPRESSION.fullmatch(value):
        raise ConfigurationError(field, value, f"must be {_EXAMPLES}")
    parse_array_expression(value, field=field)
    return value


def parse_array_expression(text: str, *, field: str = "array") -> tuple[frozenset[int], int | None]:
    """The task indices and the throttle (None: none given) of an ``--array`` value, or of
    the part inside squeue's brackets (``5-9,12%4`` of ``123_[5-9,12%4]``); the inverse of
    :func:`array_expression`. Surrounding whitespace is ignored. Raises
    :class:`~dagster_slurm.errors.ConfigurationError` naming ``field`` and ``text`` for
    anything else."""
    body, percent, throttle = text.strip().partition("%")
    indices: set[int] = set()
    for part in body.split(","):
        low, dash, high = part.partition("-")
        if not _NUMBER.fullmatch(low) or (dash and not _NUMBER.fullmatch(high)):
            raise ConfigurationError(field, text, f"must be {_EXAMPLES}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ConfigurationError(field, text, f"range {part!r} ends before it starts")
        indices.update(range(first, last + 1))
    if percent and (not _NUMBER.fullmatch(throttle) or int(throttle) < 1):
        raise ConfigurationError(field, text, "the %P throttle must be a whole number of at "
                                 "least 1")
    return frozenset(indices), int(throttle) if percent else None


def max_array_size(config: Mapping[str, str]) -> int:
    """``MaxArraySize`` of a parsed ``scontrol show config``
    (:func:`~dagster_slurm.slurm.parsers.parse_scontrol_config`): task indices of an array
    must stay below it. :data:`DEFAULT_MAX_ARRAY_SIZE` when the key is missing or its value
    is not a whole number; 0 when the site allows no job arrays at all."""
    value = str(config.get("MaxArraySize", "")).strip()
    return int(value) if _NUMBER.fullmatch(value) else DEFAULT_MAX_ARRAY_SIZE


@dataclass(frozen=True)
class ArrayChunk:
    """One job array of a run: the keys at positions ``offset`` to ``offset + size - 1``
    of the run, as the task indices 0 to ``size - 1`` of the array."""

    offset: int
    """Position (in the run's key list) of the key that task 0 runs."""
    size: int
    """Number of tasks, at least 1."""


def split_for_arrays(count: int, max_array_size: int) -> list[ArrayChunk]:
    """``count`` keys as consecutive arrays of at most ``max_array_size`` tasks each (task
    indices then stay below the site's ``MaxArraySize``); no array for no keys.

    Raises :class:`~dagster_slurm.errors.ConfigurationError` for a negative ``count``, and
    when ``max_array_size`` is 0 (below 1): the site allows no job arrays.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigurationError("count", count, "must be a whole number of keys, at least 0")
    if max_array_size < 1:
        raise ConfigurationError(
            "MaxArraySize", max_array_size,
            "this cluster allows no job arrays (MaxArraySize=0 in scontrol show config); ask "
            "its admins to allow them, or run the partitions as separate runs, one partition "
            "per run (the default backfill policy)")
    return [ArrayChunk(offset, min(max_array_size, count - offset))
            for offset in range(0, count, max_array_size)]
