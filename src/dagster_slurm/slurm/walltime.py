"""Slurm durations: reading the scheduler's time strings and writing ``--time`` values.

Slurm writes and accepts durations as ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` and
``D-H:M:S`` (``squeue`` shortens values under an hour to ``M:S``, e.g. ``2:58``);
``sacct``'s CPU times add milliseconds (``00:00.963``). A bare number means minutes.
``UNLIMITED``/``INFINITE`` mean no limit and are read as :data:`math.inf`.
"""

from __future__ import annotations

import math
import re

from dagster_slurm.errors import ConfigurationError

_UNLIMITED = frozenset({"UNLIMITED", "INFINITE"})
_INT = r"[0-9]{1,12}"
_SECONDS = r"[0-9]{1,12}(?:\.[0-9]{1,9})?"
_DURATION = re.compile(
    rf"(?:(?P<days>{_INT})-)?(?P<first>{_INT})(?::(?P<second>{_INT})(?::(?P<third>{_SECONDS}))?)?"
    rf"|(?P<minutes>{_INT}):(?P<msec>{_SECONDS})"
)
_SECONDS_PER_DAY = 86_400


def parse_duration(text: object) -> float | None:
    """Seconds in a Slurm duration string, ``math.inf`` for ``UNLIMITED``/``INFINITE``.

    None when the text is not a duration: empty, ``INVALID`` (what ``squeue`` prints as time
    left once a job overran its limit), ``N/A``, ``NOT_SET``, negative values, fields out of
    range (minutes or seconds >= 60 after the first field, hours >= 24 after a day count)
    or anything else. Never raises.
    """
    if not isinstance(text, str):
        return None
    value = text.strip()
    if value.upper() in _UNLIMITED:
        return math.inf
    match = _DURATION.fullmatch(value)
    if match is None:
        return None
    if match.group("minutes") is not None:
        return _combine(minutes=match.group("minutes"), seconds=match.group("msec"))
    days, first, second, third = match.group("days", "first", "second", "third")
    if days is None:
        if second is None:
            return _combine(minutes=first)
        if third is None:
            return _combine(minutes=first, seconds=second)
        return _combine(hours=first, minutes=second, seconds=third)
    # With a day count the fields are hours[:minutes[:seconds]].
    return _combine(days=days, hours=first, minutes=second, seconds=third, bounded_hours=True)


def _combine(
    *,
    days: str | None = None,
    hours: str | None = None,
    minutes: str | None = None,
    seconds: str | None = None,
    bounded_hours: bool = False,
) -> float | None:
    """Sum the fields; a field after the leading one must stay below its unit's range."""
    fields = [
        (days, _SECONDS_PER_DAY, None),
        (hours, 3600, 24 if bounded_hours else None),
        (minutes, 60, 60),
        (seconds, 1, 60),
    ]
    total = 0.0
    leading = True
    for raw, unit, bound in fields:
        if raw is None:
            continue
        number = float(raw)
        if not leading and bound is not None and number >= bound:
            return None
        leading = False
        total += number * unit
    return total


def format_walltime(seconds: float) -> str:
    """Write ``seconds`` as ``D-HH:MM:SS`` (one day or more) or ``HH:MM:SS``.

    ``math.inf`` gives ``UNLIMITED``. Fractions of a second are rounded up, so the written
    limit is never shorter than asked. Raises :class:`ValueError` for negative values and NaN.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, got {type(seconds).__name__}")
    if math.isnan(seconds):
        raise ValueError("seconds must be a number, got NaN")
    if seconds < 0:
        raise ValueError(f"seconds must not be negative, got {seconds!r}")
    if math.isinf(seconds):
        return "UNLIMITED"
    whole = math.ceil(seconds)
    days, rest = divmod(whole, _SECONDS_PER_DAY)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def validate_walltime(field: str, value: object) -> str:
    """Check a configured time limit and return it in canonical form (``format_walltime``).

    Accepts every Slurm duration format and ``UNLIMITED``/``INFINITE``. Raises
    :class:`~dagster_slurm.errors.ConfigurationError` naming ``field`` for anything that is
    not a string, not a duration, zero (Slurm reads 0 as "no limit"), or has fractional seconds.
    """
    examples = "such as '01:30:00', '90' (minutes), '2-00:00:00' or 'UNLIMITED'"
    if not isinstance(value, str):
        raise ConfigurationError(field, value, f"must be a Slurm time string {examples}")
    seconds = parse_duration(value)
    if seconds is None:
        problem = "must not be negative" if value.strip().startswith("-") else "is not a Slurm time"
        raise ConfigurationError(field, value, f"{problem}; use a duration {examples}")
    if seconds == 0:
        raise ConfigurationError(
            field, value, "must be positive (Slurm reads 0 as no limit; write 'UNLIMITED' for that)"
        )
    if not math.isinf(seconds) and seconds != int(seconds):
        raise ConfigurationError(field, value, "Slurm does not accept fractions of a second")
    return format_walltime(seconds)
