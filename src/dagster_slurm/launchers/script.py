"""Rendering job scripts from the templates in package data.

Templates live in ``dagster_slurm/templates`` and use :class:`ScriptTemplate`
placeholders, ``@@{name}``, so that the shell's own ``$`` needs no escaping. Values come
in two kinds, kept apart by :func:`render_template`:

* ``words``: data. A string becomes one shell word quoted with :func:`shlex.quote`; a
  sequence becomes one quoted word per line (for a bash array ``(...)``). Nothing in such
  a value is ever interpreted by the shell.
* ``fragments``: text rendered from another template of this package (a prologue), put
  in as is.

A third kind is never passed: a placeholder ``@@{protocol_<name>}`` is filled from
:data:`dagster_slurm.protocol.TEMPLATE_VALUES` (the values Python and the scripts share,
quoted as words), in every template that uses it; a caller cannot pass such a name, and one
that :mod:`dagster_slurm.protocol` does not define is an error.

A template may include another one: a line that reads exactly ``@@include <name>`` is
replaced by the text of template ``<name>`` (itself expanded the same way) before any value
is filled in. The included text's placeholders are then placeholders of the including
template, filled by the same ``words`` and ``fragments`` under the same quoting rules; an
include names a file of this package only (no path), and an include cycle is an error. Shell
code shared by several scripts (the heartbeat clock) lives in such an included template.

Every placeholder of a template must receive a value and every value passed must be used
(the protocol values are put in only where used), so a typo fails loudly instead of leaving
a hole in a script.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from string import Template

from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.protocol import TEMPLATE_PREFIX, TEMPLATE_VALUES

TEMPLATE_PACKAGE = "dagster_slurm"
TEMPLATE_DIR = "templates"

COMMON_TEMPLATE = "job_common.sh"
"""The prologue every job script starts with: variables, signal handling, status files,
job directory, environment and activation. It defines ``__ds_skip_if_signalled``,
``__ds_run_payload`` and ``__ds_finish`` for the launcher's own part."""

_LAUNCHER_NAME = re.compile(r"[a-z_]+")
_INCLUDE_LINE = re.compile(r"^@@include(?P<name>(?:[ \t].*)?)$", re.MULTILINE)
_INCLUDE_NAME = re.compile(r"[a-z0-9_]+\.sh")


class ScriptTemplate(Template):
    """A :class:`string.Template` whose placeholders read ``@@{name}`` (``$`` stays shell)."""

    delimiter = "@@"


def read_template_source(name: str) -> str:
    """The text of template file ``name`` from package data, includes not yet expanded."""
    source = resources.files(TEMPLATE_PACKAGE).joinpath(TEMPLATE_DIR).joinpath(name)
    return source.read_text(encoding="utf-8")


def expand_includes(name: str, read: Callable[[str], str] = read_template_source, *,
                    within: tuple[str, ...] = ()) -> str:
    """The text of template ``name`` (``read(name)``) with every ``@@include <other>`` line
    replaced by the expanded text of ``<other>`` (see the module docstring); ``within``: the
    templates whose includes lead to ``name``, outermost first (empty for a template
    rendered itself). Raises :class:`ValueError` naming the including template for an
    include that is not a plain ``<name>.sh`` of lowercase letters, digits and ``_``, or
    that includes itself (directly or through others)."""
    if name in within:
        raise ValueError(f"{within[-1]}: '@@include {name}' makes an include cycle "
                         f"({' -> '.join((*within, name))}); remove one of the includes")
    chain = (*within, name)

    def included(match: re.Match[str]) -> str:
        other = match.group("name").strip()
        if _INCLUDE_NAME.fullmatch(other) is None:
            raise ValueError(f"{name}: '@@include {other}' must name a template of this "
                             "package as <name>.sh (lowercase letters, digits, '_'; no path)")
        return expand_includes(other, read, within=chain).rstrip("\n")

    return _INCLUDE_LINE.sub(included, read(name))


@cache
def load_template(name: str) -> ScriptTemplate:
    """The template file ``name`` from package data, its includes expanded."""
    return ScriptTemplate(expand_includes(name))


def template_names(template: ScriptTemplate) -> frozenset[str]:
    """The placeholder names used in ``template``."""
    names = set()
    for match in template.pattern.finditer(template.template):
        name = match.group("named") or match.group("braced")
        if name:
            names.add(name)
    return frozenset(names)


def shell_word(value: str) -> str:
    """``value`` as one shell word, quoted so that the shell takes it literally."""
    if not isinstance(value, str):
        raise TypeError(f"shell words must be strings, got {type(value).__name__}")
    if "\0" in value:
        raise ValueError("shell words cannot contain NUL")
    return shlex.quote(value)


def shell_words(values: Sequence[str], indent: str = "    ") -> str:
    """The contents of a bash array ``(...)``: one quoted word per line, or nothing."""
    if not values:
        return ""
    return "".join(f"\n{indent}{shell_word(value)}" for value in values) + "\n"


def optional_word(value: int | None) -> str:
    """The word of an optional number for :func:`render_template`: ``''`` for None (the
    templates test for an empty value), else the number's decimal text."""
    return "" if value is None else str(value)


def render_template(
    name: str,
    words: Mapping[str, str | Sequence[str]],
    fragments: Mapping[str, str] | None = None,
) -> str:
    """Fill the template ``name``: ``words`` quoted (see module docstring), ``fragments`` as is,
    and the ``@@{protocol_<name>}`` placeholders it uses from the protocol values.

    Raises :class:`KeyError` for a placeholder without a value (a protocol placeholder that
    :mod:`dagster_slurm.protocol` does not define included) and :class:`ValueError` for a
    value the template does not use, a name given twice or a protocol name passed in.
    """
    template = load_template(name)
    fragments = dict(fragments or {})
    both = set(words) & set(fragments)
    if both:
        raise ValueError(f"{name}: {sorted(both)} given both as words and as fragments")
    values = dict(fragments)
    for key, value in words.items():
        values[key] = shell_word(value) if isinstance(value, str) else shell_words(value)
    reserved = sorted(key for key in values if key.startswith(TEMPLATE_PREFIX))
    if reserved:
        raise ValueError(f"{name}: {reserved} come from dagster_slurm.protocol and cannot be "
                         "passed")
    used = template_names(template)
    unused = set(values) - used
    if unused:
        raise ValueError(f"{name}: values {sorted(unused)} are not used by the template")
    for key in sorted(used):
        if key.startswith(TEMPLATE_PREFIX):
            if key not in TEMPLATE_VALUES:
                raise KeyError(f"{name}: @@{{{key}}} names no value of dagster_slurm.protocol")
            values[key] = shell_word(TEMPLATE_VALUES[key])
    return template.substitute(values)


def render_prologue(plan: ExecutionPlan, *, launcher: str) -> str:
    """The common start of every job script for ``plan`` (see :data:`COMMON_TEMPLATE`).

    ``launcher`` names the launcher in the script's header comment (lowercase letters and
    ``_`` only, as it lands in a comment).
    """
    if _LAUNCHER_NAME.fullmatch(launcher) is None:
        raise ValueError(f"launcher name {launcher!r} must be lowercase letters and '_'")
    assignments = [f"{key}={value}" for key, value in plan.env.items()]
    return render_template(
        COMMON_TEMPLATE,
        {
            "launcher": launcher,
            "mode": plan.mode,
            "job_dir": plan.job_dir,
            "status_file": plan.status_file,
            "drain_file": plan.drain_file,
            "pid_file": plan.pid_file or "",
            "drain_signal": plan.drain_signal_name,
            "activation": plan.activation or "",
            "env": assignments,
            "payload": list(plan.payload),
            "heartbeat_file": plan.heartbeat_file or "",
            "heartbeat_timeout": plan.heartbeat_seconds,
            "restart_allowed": "1" if plan.restart_allowed else "",
            "array_tasks": plan.array_tasks_file or "",
        },
    )
