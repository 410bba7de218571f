"""Unknown configuration names: refused, with the closest real name as a suggestion.

Every resource and configuration class of the library derives from :class:`KnownFieldsOnly`
besides its Dagster base class. A keyword that is not a field (or a field's alias) then
fails at construction, before anything is submitted, with a message such as::

    unknown field 'mdoe' of ComputeResource; did you mean 'mode'?

The check runs as a pydantic ``before`` validator, so it applies however the object is
built: called directly, nested as a dictionary in another configuration, or rebuilt by
Dagster from run config (where Dagster's own schema check names unexpected entries first).
The error is a :class:`UnknownFieldError`, a
:class:`~dagster_slurm.errors.ConfigurationError`; pydantic reports it inside a
``ValidationError`` whose text carries the message and the location of the nested object.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from dagster_slurm.errors import ConfigurationError

SUGGESTION_CUTOFF = 0.6
"""Least similarity (:class:`difflib.SequenceMatcher` ratio) for a name to be suggested."""


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The name in ``known`` most similar to ``name``; None when none is similar enough.

    Case is ignored when comparing, so ``Mode`` suggests ``mode``.
    """
    by_lower = {candidate.lower(): candidate for candidate in sorted(known)}
    matches = difflib.get_close_matches(name.lower(), by_lower, n=1, cutoff=SUGGESTION_CUTOFF)
    return by_lower[matches[0]] if matches else None


def unknown_name_problem(name: str, known: Iterable[str], *, what: str = "field") -> str:
    """``"unknown field 'mdoe'; did you mean 'mode'?"``, or the list of the known names
    when none is close. ``what`` is the kind of name (``field``, ``option``)."""
    names = sorted(set(known))
    suggestion = closest_name(name, names)
    if suggestion is not None:
        return f"unknown {what} {name!r}; did you mean {suggestion!r}?"
    return f"unknown {what} {name!r}; the {what}s are " + ", ".join(names)


class UnknownFieldError(ConfigurationError):
    """A keyword that is not a field of the class it was given to.

    ``field`` is the keyword as given, ``value`` its value, ``owner`` the class name,
    ``suggestion`` the closest real field (None when none is close) and ``others`` the
    further unknown keywords of the same call. The message leads with the class and the
    unknown name: ``ComputeResource: unknown field 'mdoe'; did you mean 'mode'?``.
    """

    def __init__(
        self, owner: str, field: str, value: object, known: Iterable[str],
        others: Sequence[str] = (),
    ) -> None:
        names = sorted(set(known))
        self.owner = owner
        self.suggestion = closest_name(field, names)
        self.others = tuple(others)
        self.field = field
        self.value = value
        self.problem = unknown_name_problem(field, names)
        if self.others:
            self.problem += " (also unknown: " + ", ".join(map(repr, self.others)) + ")"
        Exception.__init__(self, f"{owner}: {self.problem}")


def accepted_names(model: type[BaseModel]) -> set[str]:
    """The keywords ``model`` accepts: its field names and their aliases."""
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
    return names


def refuse_unknown_fields(model: type[BaseModel], data: Any) -> Any:
    """``data`` unchanged when it names only fields of ``model``; raises
    :class:`UnknownFieldError` otherwise, about the first unknown keyword in sorted order
    (the same on every run) and listing the others. Non-mapping ``data`` (an instance
    being re-validated) passes unchanged."""
    if not isinstance(data, Mapping):
        return data
    known = accepted_names(model)
    unknown = sorted((key for key in data if key not in known), key=str)
    if unknown:
        first = unknown[0]
        raise UnknownFieldError(
            model.__name__, str(first), data[first], known, [str(key) for key in unknown[1:]]
        )
    return data


class KnownFieldsOnly(BaseModel):
    """Mixin for pydantic (Dagster) configuration classes: unknown keywords are errors.

    List it after the Dagster base class: ``class X(Config, KnownFieldsOnly)``.
    """

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_fields(cls, data: Any) -> Any:
        return refuse_unknown_fields(cls, data)
