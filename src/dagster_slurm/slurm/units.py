"""Small readers shared by the parsers: sizes, integers and timestamps in Slurm output."""

from __future__ import annotations

import re
from datetime import datetime

_SIZE = re.compile(r"([0-9]{1,18}(?:\.[0-9]{1,9})?)([KMGTP]?)", re.IGNORECASE)
_UNIT_FACTOR: dict[str, int] = {
    unit: 1024**power for power, unit in enumerate(("", "K", "M", "G", "T", "P"))
}
_INT = re.compile(r"[0-9]{1,18}")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}")


def parse_size_bytes(text: object, *, default_unit: str = "") -> int | None:
    """Bytes in a Slurm size such as ``322336K``, ``1.5G`` or ``1000M`` (binary units).

    A number without a unit is read in ``default_unit`` (``""`` = bytes, as in ``sacct``;
    ``"M"`` for memory requests). None for empty or unreadable text. Never raises.
    """
    if not isinstance(text, str):
        return None
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return None
    unit = (match.group(2) or default_unit).upper()
    factor = _UNIT_FACTOR.get(unit)
    if factor is None:
        return None
    number = match.group(1)
    if "." in number:
        return int(float(number) * factor)
    return int(number) * factor


def parse_int(text: object) -> int | None:
    """A non-negative decimal integer, None for anything else (``N/A``, empty, signs)."""
    if not isinstance(text, str):
        return None
    value = text.strip()
    return int(value) if _INT.fullmatch(value) else None


def parse_timestamp(text: object) -> datetime | None:
    """A Slurm timestamp ``YYYY-MM-DDTHH:MM:SS`` as a naive datetime in the cluster's local time.

    None for ``N/A``, ``Unknown``, ``None``, empty or impossible dates. Never raises.
    """
    if not isinstance(text, str):
        return None
    value = text.strip()
    if _TIMESTAMP.fullmatch(value) is None:
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None


def optional_text(text: object, *, none_values: frozenset[str] = frozenset()) -> str | None:
    """Stripped text, None when it is empty or one of ``none_values`` (compared case-blind)."""
    if not isinstance(text, str):
        return None
    value = text.strip()
    if not value or value.lower() in none_values:
        return None
    return value
