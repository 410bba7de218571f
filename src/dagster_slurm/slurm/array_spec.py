"""The ``--array`` value of a job array and the site's limit on arrays (pure).

``MaxArraySize`` (``scontrol show config``) bounds the task *index*: indices run from 0 to
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

_EXPRESSION = re.compile(r"^(\d+(-\d+)?)(,\d+(-\d+)?)*(%\d+)?$")


def validate_array_parallelism(field: str, value: object) -> int | None:
    """``value`` as an ``--array`` throttle: None, or a whole number of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(field, value, "must be a whole number of at least 1, or None")
    return value


def array_expression(indices: Iterable[int], parallelism: int | None = None) -> str:
    """The ``--array`` value for ``indices`` (sorted, duplicates dropped, runs of
    consecutive indices written as ranges: ``0-4,7,9-12``), with ``%parallelism`` when
    given (at most that many tasks run at once)."""
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
    """``value`` checked as an ``--array`` value (indices, ``N-M`` ranges with N <= M,
    comma separated, an optional ``%N`` with N >= 1)."""
    if not isinstance(value, str) or not _EXPRESSION.match(value):
        raise ConfigurationError(field, value, "must be task indices and ranges such as "
                                 "'0-99' or '0-4,7%3'")
    parse_array_expression(value, field=field)
    return value


def parse_array_expression(text: str, *, field: str = "array") -> tuple[frozenset[int], int | None]:
    """The task indices and the throttle (None: none) of an ``--array`` value, or of the
    part inside squeue's brackets (``5-9,12%4``)."""
    body, _, throttle = text.strip().partition("%")
    indices: set[int] = set()
    for part in body.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ConfigurationError(field, text, "must be task indices and ranges such as '0-99'")
        first, last = int(low), int(high) if high else int(low)
        if last < first:
            raise ConfigurationError(field, text, f"range {part!r} ends before it starts")
        indices.update(range(first, last + 1))
    if throttle and (not throttle.isdigit() or int(throttle) < 1):
        raise ConfigurationError(field, text, "the %N throttle must be at least 1")
    return frozenset(indices), int(throttle) if throttle else None


def max_array_size(config: Mapping[str, str]) -> int:
    """``MaxArraySize`` of a parsed ``scontrol show config``; :data:`DEFAULT_MAX_ARRAY_SIZE`
    when it is missing or unreadable; 0 where the site allows no job arrays."""
    value = str(config.get("MaxArraySize", "")).strip()
    return int(value) if value.isdigit() else DEFAULT_MAX_ARRAY_SIZE


@dataclass(frozen=True)
class ArrayChunk:
    """Keys at positions ``offset`` to ``offset + size - 1`` of a run, as the task indices
    0 to ``size - 1`` of one array."""

    offset: int
    size: int


def split_for_arrays(count: int, max_size: int) -> list[ArrayChunk]:
    """``count`` keys as arrays of at most ``max_size`` tasks (indices below the site's
    ``MaxArraySize``). Raises :class:`ConfigurationError` where arrays are disabled."""
    if max_size < 1:
        raise ConfigurationError(
            "MaxArraySize", max_size,
            "this cluster allows no job arrays; ask its admins to allow them, or run one "
            "partition per run (the default backfill policy)")
    return [ArrayChunk(offset, min(max_size, count - offset))
            for offset in range(0, count, max_size)]
