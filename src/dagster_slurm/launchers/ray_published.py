"""``ray start`` options of the published package's ``RayLauncher(ray_start_args=...)`` that
map onto a launcher field.

The launcher passes ``--include-dashboard`` to ``ray start`` itself, from its
``include_dashboard`` field, so the option is refused in ``ray_start_args``
(:data:`~dagster_slurm.launchers.ray_limits.RAY_MANAGED_OPTIONS`). Code written for the
published package turned the dashboard off with
``ray_start_args=["--include-dashboard=false"]``; that entry (or the pair
``"--include-dashboard", "false"``) is taken out of ``ray_start_args`` and sets
``include_dashboard``, with a :class:`DeprecationWarning` that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster_slurm.config_errors import warn_at_caller
from dagster_slurm.errors import ConfigurationError

OPTION = "--include-dashboard"
"""The ``ray start`` option that :func:`move_include_dashboard` maps."""

_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


def ray_bool(text: object) -> bool | None:
    """``text`` read as ``ray start`` reads a boolean (``true``/``false``, ``1``/``0``,
    ``yes``/``no``, ``on``/``off``, any case); None when it is none of them."""
    if not isinstance(text, str):
        return None
    word = text.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def _dashboard_entries(args: Sequence[Any]) -> tuple[list[Any], list[tuple[str, bool]]]:
    """``args`` without the ``--include-dashboard`` entries, and those entries (as written)
    with the value each gives."""
    kept: list[Any] = []
    found: list[tuple[str, bool]] = []
    index = 0
    while index < len(args):
        entry = args[index]
        name, equals, text = entry.partition("=") if isinstance(entry, str) else ("", "", "")
        following = args[index + 1] if index + 1 < len(args) else None
        if name != OPTION or (not equals and ray_bool(following) is None):
            kept.append(entry)  # not the option, or a bare one: the usual rules refuse it
            index += 1
            continue
        value = ray_bool(text if equals else following)
        if value is None:
            raise ConfigurationError(
                "ray_start_args", list(args),
                f"{entry!r}: {OPTION} takes true or false; better, set include_dashboard",
            )
        shown = entry if equals else f"{entry} {following}"
        found.append((shown, value))
        index += 1 if equals else 2
    return kept, found


def move_include_dashboard(data: Any) -> Any:
    """``data`` (a RayLauncher's keyword mapping) with ``--include-dashboard`` taken out of
    ``ray_start_args`` and set as ``include_dashboard``, with a DeprecationWarning; other
    data unchanged. Raises :class:`ConfigurationError` when the entries disagree with each
    other or with an ``include_dashboard`` also given."""
    if not isinstance(data, Mapping):
        return data
    args = data.get("ray_start_args")
    if not isinstance(args, list | tuple):
        return data
    kept, found = _dashboard_entries(args)
    if not found:
        return data
    values = {value for _, value in found}
    if len(values) > 1:
        raise ConfigurationError("ray_start_args", list(args),
                                 f"gives {OPTION} twice with different values")
    value = values.pop()
    given = data.get("include_dashboard")
    if given is not None and given != value:
        raise ConfigurationError(
            "ray_start_args", list(args),
            f"{found[0][0]!r} contradicts include_dashboard={given!r}; set only include_dashboard",
        )
    warn_at_caller(
        f"RayLauncher(ray_start_args=[{found[0][0]!r}]) comes from the published "
        f"dagster-slurm package; use include_dashboard={value} (the launcher passes "
        f"{OPTION} itself; the entry is accepted for now and will be refused later)",
        DeprecationWarning,
    )
    return {**data, "ray_start_args": kept, "include_dashboard": value}
