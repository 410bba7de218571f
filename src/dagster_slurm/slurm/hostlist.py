"""Expansion of Slurm host lists such as ``c[1-2],g[01-03,7],x``."""

from __future__ import annotations

import itertools
import re

MAX_HOSTS = 100_000
"""Largest expansion :func:`expand_hostlist` produces; longer lists are unreadable (None)."""

_NO_NODES = frozenset({"", "none assigned", "(null)", "n/a", "none"})
_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")
_LITERAL = re.compile(r"[^\[\],\s]+")


def expand_hostlist(text: object) -> tuple[str, ...] | None:
    """Host names in a Slurm host list, in order, zero padding kept (``g[01-02]`` → g01, g02).

    Several bracket groups in one name multiply (``r[1-2]n[1-2]`` → r1n1, r1n2, r2n1, r2n2).
    Empty text and Slurm's "no nodes" spellings (``None assigned``, ``(null)``, ``N/A``) give
    an empty tuple. None when the text is not a host list (unbalanced brackets, descending
    or non-numeric ranges, whitespace) or would expand to more than :data:`MAX_HOSTS`
    names. Never raises.
    """
    if not isinstance(text, str):
        return None
    value = text.strip()
    if value.lower() in _NO_NODES:
        return ()
    items = _split_top_level(value)
    if items is None:
        return None
    hosts: list[str] = []
    for item in items:
        groups = _parse_item(item)
        if groups is None:
            return None
        count = 1
        for group in groups:
            count *= len(group)
        if len(hosts) + count > MAX_HOSTS:
            return None
        hosts.extend("".join(parts) for parts in itertools.product(*groups))
    return tuple(hosts)


def _split_top_level(value: str) -> list[str] | None:
    """Split at commas outside brackets; None for unbalanced brackets or empty items."""
    items: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(value):
        if char == "[":
            depth += 1
            if depth > 1:
                return None
        elif char == "]":
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            items.append(value[start:index])
            start = index + 1
    items.append(value[start:])
    if depth != 0 or any(not item for item in items):
        return None
    return items


def _parse_item(item: str) -> list[list[str]] | None:
    """One host expression as a list of alternatives per position, None if malformed."""
    groups: list[list[str]] = []
    position = 0
    while position < len(item):
        if item[position] == "[":
            end = item.index("]", position)
            choices = _expand_ranges(item[position + 1 : end])
            if choices is None:
                return None
            groups.append(choices)
            position = end + 1
            continue
        match = _LITERAL.match(item, position)
        if match is None:
            return None
        groups.append([match.group(0)])
        position = match.end()
    return groups


def _expand_ranges(body: str) -> list[str] | None:
    """``01-03,7`` → ``['01', '02', '03', '7']``; None if malformed or too long."""
    values: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            return None
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low or len(values) + high - low + 1 > MAX_HOSTS:
            return None
        width = len(low_text)
        values.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    return values
