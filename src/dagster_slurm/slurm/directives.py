"""Validation of user-supplied extra ``sbatch`` options.

Users may pass options the library has no field for (``--dependency=afterany:123``,
``--constraint=a100``, ``--begin=now+1hour``). Each entry is one long-form option,
``--name`` or ``--name=value``. Rejected, with a message naming the entry:

* short forms (``-t 10``) and anything that is not ``--name[=value]``;
* whitespace, control characters, quotes and backslashes anywhere in the entry (the same
  entries may be written as ``#SBATCH`` lines, where sbatch would interpret them);
* options the library sets itself (:data:`MANAGED_SBATCH_OPTIONS`; the message names the
  field to use instead) and options that would break submission
  (:data:`FORBIDDEN_SBATCH_OPTIONS`, e.g. ``--wait``);
* abbreviations of those options (sbatch accepts ``--part=x`` for ``--partition=x``);
* the same option twice (``--begin=a`` and ``--begin``).

The same rules serve other programs' extra options (``ray start`` in
:mod:`dagster_slurm.launchers.ray_limits`): :func:`validate_option_entries` takes an
:class:`OptionRules` that names the program's reserved options; :func:`sbatch_rules` gives
sbatch's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dagster_slurm.errors import ConfigurationError

_FIELD = "is managed by the library; use the first-class field {}"
_SET_BY_LIBRARY = "is set by the library for every submission"

#: Options the library sets from first-class fields, with what to use instead.
MANAGED_OPTION_ADVICE: dict[str, str] = {
    "job-name": _SET_BY_LIBRARY + " (pass job_name when building the submission)",
    "output": _SET_BY_LIBRARY + " (the log location belongs to the run)",
    "error": _SET_BY_LIBRARY + " (the log location belongs to the run)",
    "open-mode": _SET_BY_LIBRARY + " (append: a second start of a job keeps the first's logs)",
    "chdir": _SET_BY_LIBRARY + " (the working directory belongs to the run)",
    "parsable": _SET_BY_LIBRARY + " (the job id is read from its output)",
    "wrap": "is not allowed: the library submits its own batch script",
    "test-only": "is not allowed: start-time estimates have their own call",
    "comment": _SET_BY_LIBRARY + " (it carries the submission token)",
    "partition": _FIELD.format("partition"),
    "qos": _FIELD.format("qos"),
    "account": _FIELD.format("account"),
    "reservation": _FIELD.format("reservation"),
    "time": _FIELD.format("time_limit"),
    "time-min": _FIELD.format("time_min"),
    "nodes": _FIELD.format("num_nodes"),
    "ntasks": _SET_BY_LIBRARY + " (the launcher decides the task layout)",
    "ntasks-per-node": _SET_BY_LIBRARY + " (the launcher decides the task layout)",
    "cpus-per-task": _FIELD.format("cpus"),
    "mem": _FIELD.format("mem"),
    "mem-per-cpu": _FIELD.format("mem_per_cpu"),
    "gres": _FIELD.format("gpus_per_node"),
    "gpus": _FIELD.format("gpus_per_node"),
    "gpus-per-node": _FIELD.format("gpus_per_node"),
    "signal": _FIELD.format("signal_before_timeout"),
    "nodelist": _FIELD.format("nodelist"),
    "exclusive": _FIELD.format("exclusive"),
    "export": _SET_BY_LIBRARY + " (the environment is prepared by the launcher)",
    "array": "is set by the library, which makes the job arrays of partitioned runs itself "
    "(compute.run over several partition keys, at most array_parallelism tasks at once); "
    "do not pass --array yourself",
    "hold": _SET_BY_LIBRARY + " (held submissions are requested explicitly)",
    "requeue": _FIELD.format("requeue") + " (run allocations are never requeued)",
    "no-requeue": _FIELD.format("requeue") + " (False, the default, passes --no-requeue)",
}

MANAGED_SBATCH_OPTIONS: frozenset[str] = frozenset(MANAGED_OPTION_ADVICE)
"""Long option names (without ``--``) that the library sets itself."""

#: Options that would break submission or status tracking, with the reason.
FORBIDDEN_OPTION_REASONS: dict[str, str] = {
    "wait": "would block sbatch until the job ends",
    "help": "would print help instead of submitting",
    "usage": "would print usage instead of submitting",
    "version": "would print the version instead of submitting",
    "clusters": "would submit to another cluster, where status queries do not look",
}

FORBIDDEN_SBATCH_OPTIONS: frozenset[str] = frozenset(FORBIDDEN_OPTION_REASONS)
"""Long option names (without ``--``) that are never accepted as extra directives."""

#: sbatch's short options that map to a managed or forbidden long option.
SHORT_OPTION_NAMES: dict[str, str] = {
    "A": "account",
    "a": "array",
    "c": "cpus-per-task",
    "D": "chdir",
    "e": "error",
    "G": "gpus",
    "H": "hold",
    "h": "help",
    "J": "job-name",
    "M": "clusters",
    "N": "nodes",
    "n": "ntasks",
    "o": "output",
    "p": "partition",
    "q": "qos",
    "t": "time",
    "V": "version",
    "W": "wait",
    "w": "nodelist",
}

_ENTRY = re.compile(r"--(?P<name>[a-z][a-z0-9-]*)(?:=(?P<value>.*))?", re.DOTALL)
_LOOSE_NAME = re.compile(r"--([A-Za-z0-9-]+)")
_RESERVED = MANAGED_SBATCH_OPTIONS | FORBIDDEN_SBATCH_OPTIONS
_UNSAFE = frozenset("'\"\\`")
_FIELD_ADVICE = _FIELD.format("")


def option_name(entry: str) -> str | None:
    """The option name of a ``--name[=value]`` entry, None when it has another shape."""
    match = _ENTRY.fullmatch(entry)
    return match.group("name") if match is not None else None


@dataclass(frozen=True)
class OptionRules:
    """What one program accepts in a list of extra long-form options.

    ``reserved`` gives the problem with an option name the caller may not pass (None: the
    name is free); ``short_form`` the problem with a short option such as ``-t 10``;
    ``abbreviated`` the names whose prefixes ``program`` would also accept (sbatch does,
    so ``--part=x`` is refused like ``--partition=x``); ``example`` an acceptable entry,
    shown in messages.
    """

    program: str
    reserved: Callable[[str], str | None]
    short_form: Callable[[str], str]
    abbreviated: frozenset[str] = frozenset()
    example: str = "--constraint=a100"


def _reserved_problem(name: str, field_names: Mapping[str, str] | None = None) -> str | None:
    if name in MANAGED_OPTION_ADVICE:
        advice = MANAGED_OPTION_ADVICE[name]
        if field_names and advice.startswith(_FIELD_ADVICE):
            field = advice[len(_FIELD_ADVICE):]
            advice = _FIELD.format(field_names.get(field, field))
        return f"--{name} {advice}"
    if name in FORBIDDEN_OPTION_REASONS:
        return f"--{name} is not allowed: it {FORBIDDEN_OPTION_REASONS[name]}"
    return None


def _short_form_problem(entry: str, field_names: Mapping[str, str] | None = None) -> str:
    letter = entry[1:2]
    long_name = SHORT_OPTION_NAMES.get(letter)
    text = "only long-form options are accepted, one per entry, e.g. '--constraint=a100'"
    if long_name is None:
        return text
    reserved = _reserved_problem(long_name, field_names)
    return f"-{letter} is --{long_name}; {reserved}" if reserved else text


def sbatch_rules(field_names: Mapping[str, str] | None = None) -> OptionRules:
    """The rules for extra ``sbatch`` options. ``field_names`` maps the library's field
    names in the advice (``cpus``) to the caller's spelling of them (``cpus_per_task``)."""
    return OptionRules(
        program="sbatch",
        reserved=lambda name: _reserved_problem(name, field_names),
        short_form=lambda entry: _short_form_problem(entry, field_names),
        abbreviated=_RESERVED,
    )


def _entry_problem(entry: str, rules: OptionRules) -> tuple[str, str | None]:
    """``(option name, problem)`` for one entry; the problem is None when it is acceptable."""
    if entry.startswith("-") and not entry.startswith("--"):
        return "", rules.short_form(entry)
    loose = _LOOSE_NAME.match(entry)
    reserved = rules.reserved(loose.group(1).lower()) if loose is not None else None
    if reserved is not None:
        return "", reserved
    if any(char.isspace() or ord(char) < 32 or ord(char) == 127 for char in entry):
        return "", "must not contain whitespace or control characters; one option per entry"
    if any(char in _UNSAFE for char in entry):
        return "", "must not contain quotes or backslashes; write the value unquoted"
    match = _ENTRY.fullmatch(entry)
    if match is None:
        return "", (
            "must be one long-form option '--name' or '--name=value' with a lower-case name, "
            f"e.g. {rules.example!r}"
        )
    name, value = match.group("name"), match.group("value")
    if value == "":
        return name, "has an empty value after '='; drop the '=' or give a value"
    for full in sorted(rules.abbreviated):
        if full.startswith(name):
            return name, (
                f"looks like an abbreviation of --{full}, which {rules.program} would accept; "
                f"{rules.reserved(full)}"
            )
    return name, None


def validate_option_entries(
    entries: Iterable[str] | None, *, field: str, rules: OptionRules
) -> tuple[str, ...]:
    """Check a list of extra long-form options under ``rules``; return them as a tuple.

    Each entry is one ``--name`` or ``--name=value`` without whitespace, control
    characters, quotes or backslashes, and names each option once. None is read as no
    entries. Raises :class:`~dagster_slurm.errors.ConfigurationError` whose field is
    ``<field>[<index>]`` and whose value is the offending entry.
    """
    if entries is None:
        return ()
    if isinstance(entries, (str, bytes)):
        raise ConfigurationError(field, entries, "must be a list of options, not one string")
    checked: list[str] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{field}[{index}]"
        if not isinstance(entry, str):
            raise ConfigurationError(where, entry, f"must be a string such as {rules.example!r}")
        name, problem = _entry_problem(entry, rules)
        if problem is not None:
            raise ConfigurationError(where, entry, problem)
        if name in seen:
            raise ConfigurationError(
                where, entry, f"repeats --{name} from {field}[{seen[name]}]; give each option once"
            )
        seen[name] = index
        checked.append(entry)
    return tuple(checked)


def validate_extra_sbatch_directives(
    entries: Iterable[str] | None,
    *,
    field: str = "extra_sbatch_directives",
    field_names: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """Check extra sbatch options and return them as a tuple, in the given order.

    None is read as no entries. Raises :class:`~dagster_slurm.errors.ConfigurationError`
    whose field is ``<field>[<index>]`` and whose value is the offending entry; the message
    says what to use instead, naming fields as ``field_names`` spells them (see
    :func:`sbatch_rules`).
    """
    return validate_option_entries(entries, field=field, rules=sbatch_rules(field_names))
