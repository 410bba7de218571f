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

Names of the published package that a class does not have at all, but that user code
written for that package may still pass, are listed in its ``removed_fields`` (name -> what
to use instead): such a name is refused with a :class:`RemovedFieldError` that gives the
replacement rather than a spelling suggestion.

Names of the published dagster-slurm 1.x package that a class still accepts are listed in
its ``renamed_fields`` (:class:`RenamedField`): the value moves to the field of today's name
(``known_hosts_file`` to ``known_hosts_path``, ``time_limit`` to
``run_allocation.time_limit``), with a :class:`DeprecationWarning` that names the new name.
Both names given at once is an error naming both; an invalid value is refused with the
message of the new field, naming the field as the user spelled it. The old names are not
fields: they are not in the configuration reference or in Dagster's config schema.
A Dagster resource with such names also lists :class:`PublishedNames` first among its
bases, so that the configuration Dagster records (and rebuilds the resource from) holds the
values under today's names.

Names of the published package that have no equivalent here are listed in a class's
``withdrawn_fields`` (:class:`WithdrawnField`): giving one is a :class:`WithdrawnFieldError`
that says, for each such name given, what to write instead; a value that asks for what this
library does anyway (``session=None``) is dropped with a :class:`DeprecationWarning` instead.
"""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pydantic
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from dagster_slurm.errors import ConfigurationError, shown_value

SUGGESTION_CUTOFF = 0.6
"""Least similarity (:class:`difflib.SequenceMatcher` ratio) for a name to be suggested."""

WHOLE_WORD_BONUS = 0.1
"""Added to the similarity of a known name that has the unknown name as a whole word."""


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The name in ``known`` most similar to ``name``; None when none is similar enough.

    Case is ignored when comparing, so ``Mode`` suggests ``mode``. Similarity is
    :class:`difflib.SequenceMatcher`'s ratio, with :data:`WHOLE_WORD_BONUS` added for a
    known name that has ``name`` as one of its ``_``-separated words, so ``nodes`` suggests
    ``num_nodes`` rather than ``nodelist``.
    """
    by_lower = {candidate.lower(): candidate for candidate in sorted(known)}
    wanted = name.lower()
    best: tuple[float, str] | None = None
    for candidate in by_lower:
        ratio = difflib.SequenceMatcher(None, wanted, candidate).ratio()
        if ratio < SUGGESTION_CUTOFF:
            continue
        score = ratio + (WHOLE_WORD_BONUS if wanted in candidate.split("_") else 0.0)
        if best is None or score > best[0]:
            best = (score, candidate)
    return by_lower[best[1]] if best is not None else None


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


class RemovedFieldError(ConfigurationError):
    """A keyword of the published dagster-slurm package that the class it was given to
    does not have (see ``removed_fields``). ``field``, ``value`` as given, ``owner`` the
    class name; the message leads with the class and says what to use instead."""

    def __init__(self, owner: str, field: str, value: object, advice: str) -> None:
        self.owner = owner
        self.field = field
        self.value = value
        self.problem = f"{field} is a field of the published dagster-slurm package, not here: {advice}"
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
    removed: Mapping[str, str] = getattr(model, "removed_fields", {})
    for key in unknown:
        if key in removed:
            raise RemovedFieldError(model.__name__, str(key), data[key], removed[key])
    if unknown:
        first = unknown[0]
        raise UnknownFieldError(
            model.__name__, str(first), data[first], known, [str(key) for key in unknown[1:]]
        )
    return data


# -- names of the published package ------------------------------------------------------------


@dataclass(frozen=True)
class RenamedField:
    """A keyword of the published dagster-slurm 1.x package accepted for one of our fields.

    ``old``: the published keyword. ``new``: the field it sets, a dotted path for a field of
    a nested configuration (``run_allocation.time_limit``). ``convert``: turns a value of
    the old keyword into one of the new field (a change of unit); None passes it unchanged.
    It may raise :class:`~dagster_slurm.errors.ConfigurationError` naming ``old``.
    """

    old: str
    new: str
    convert: Callable[[Any], Any] | None = None


_LIBRARY_DIRS: tuple[str, ...] = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (__file__, pydantic.__file__)
)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn`, called from :func:`warn_at_caller`, that
    points at the first frame outside this library, pydantic and Dagster (the user's line)."""
    internal = _LIBRARY_DIRS + tuple(
        os.path.dirname(os.path.abspath(module.__file__)) + os.sep
        for name in ("dagster", "pydantic_core")
        if (module := sys.modules.get(name)) is not None and getattr(module, "__file__", None)
    )
    frame, level = sys._getframe(2), 2  # 1: warn_at_caller itself
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(internal):
        frame, level = frame.f_back, level + 1
    return level


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """:func:`warnings.warn` attributed to the first line outside this library, pydantic
    and Dagster (the user's line that led to the warning)."""
    warnings.warn(message, category, stacklevel=_caller_stacklevel())


def warn_renamed(old: str, new: str) -> None:
    """A :class:`DeprecationWarning` that ``old`` (a name of the published package) is
    ``new`` in this library, attributed to the user's line."""
    warn_at_caller(
        f"{old!s} comes from the published dagster-slurm package; use {new!s} "
        "(the old name is accepted for now and will be removed)",
        DeprecationWarning,
    )


@dataclass(frozen=True)
class Moved:
    """A value given under a published name: ``old`` as the user spelled it, ``path`` the
    field it went to (as location parts, ``("run_allocation", "time_limit")``), ``value``
    as given."""

    old: str
    path: tuple[str, ...]
    value: object


def _given(container: object, name: str) -> bool:
    """Whether ``container`` (a mapping or a pydantic model) holds a non-None ``name``."""
    if isinstance(container, Mapping):
        return container.get(name) is not None
    if isinstance(container, BaseModel):
        return name in container.model_fields_set and getattr(container, name) is not None
    return False


def _both_given(rename: RenamedField, value: object) -> ConfigurationError:
    return ConfigurationError(
        rename.old, value,
        f"given together with {rename.new}; {rename.old} is the published package's name "
        f"of {rename.new}: set only {rename.new}",
    )


def _place(data: dict[str, Any], rename: RenamedField, value: object) -> None:
    """Put ``value`` (already converted) at ``rename.new`` in ``data``; refuses a field that
    is given already."""
    head, _, leaf = rename.new.partition(".")
    if not leaf:
        if _given(data, head):
            raise _both_given(rename, value)
        data[head] = value
        return
    nested = data.get(head)
    if _given(nested, leaf):
        raise _both_given(rename, value)
    if isinstance(nested, BaseModel):
        values = {name: getattr(nested, name) for name in nested.model_fields_set}
        data[head] = type(nested).model_validate({**values, leaf: value})
    else:
        data[head] = {**(nested or {}), leaf: value}


def accept_renamed_fields(model: type[BaseModel], data: Any) -> tuple[Any, list[Moved]]:
    """``data`` with every published name of ``model.renamed_fields`` moved to its field
    (one :class:`DeprecationWarning` each), and what was moved. Raises
    :class:`ConfigurationError` when a published name and its field are both given.
    Non-mapping ``data`` passes unchanged."""
    renames: Sequence[RenamedField] = getattr(model, "renamed_fields", ())
    if not isinstance(data, Mapping) or not any(r.old in data for r in renames):
        return data, []
    out = dict(data)
    moved: list[Moved] = []
    for rename in renames:
        if rename.old not in out:
            continue
        value = out.pop(rename.old)
        warn_renamed(f"{model.__name__}({rename.old}=...)", rename.new)
        try:
            _place(out, rename, rename.convert(value) if rename.convert else value)
        except ValidationError as error:  # a nested model rebuilt with the value
            raise in_given_words(error, [Moved(rename.old, (rename.new.split(".")[-1],), value)]) from None
        moved.append(Moved(rename.old, tuple(rename.new.split(".")), value))
    return out, moved


@dataclass(frozen=True)
class WithdrawnField:
    """A keyword of the published dagster-slurm 1.x package that is not a field here.

    ``name``: the keyword. ``instead``: what to write instead, as the error shows it (a
    sentence without a final full stop), or a function of the value given that returns it.
    ``harmless``: tells whether a value asks for what this library does anyway
    (``session=None``: no session); such a value is dropped with a
    :class:`DeprecationWarning` that says to leave the keyword out and why nothing changes
    (``harmless_note``). None: every value is refused.
    """

    name: str
    instead: str | Callable[[Any], str]
    harmless: Callable[[Any], bool] | None = None
    harmless_note: str = ""

    def advice(self, value: object) -> str:
        """What to write instead of this keyword given ``value``."""
        return self.instead(value) if callable(self.instead) else self.instead


class WithdrawnFieldError(ConfigurationError):
    """Keywords of the published package that have no equivalent in the class given them.

    ``owner``: the class name; ``given``: ``(keyword, value, instead)`` for each such keyword
    given, in sorted order (``field`` and ``value`` are those of the first). The message
    names each keyword with its value and what to write instead, e.g.
    ``ComputeResource: pack_on_remote=True is the published package's field, with no
    equivalent here: environments are packed on this machine ...; remove pack_on_remote``.
    """

    def __init__(self, owner: str, given: Sequence[tuple[str, object, str]]) -> None:
        self.owner = owner
        self.given = tuple(given)
        self.field, self.value, _ = self.given[0]
        self.problem = "; ".join(
            f"{name}={shown_value(value)} is the published package's field, with no "
            f"equivalent here: {instead}"
            for name, value, instead in self.given
        )
        Exception.__init__(self, f"{owner}: {self.problem}")


def drop_withdrawn_fields(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the keywords of ``model.withdrawn_fields`` whose value is harmless
    (one :class:`DeprecationWarning` each); raises :class:`WithdrawnFieldError` naming every
    other withdrawn keyword given. Non-mapping ``data`` passes unchanged."""
    withdrawn: Sequence[WithdrawnField] = getattr(model, "withdrawn_fields", ())
    if not isinstance(data, Mapping) or not any(w.name in data for w in withdrawn):
        return data
    out = dict(data)
    refused: list[tuple[str, object, str]] = []
    for item in sorted(withdrawn, key=lambda w: w.name):
        if item.name not in out:
            continue
        value = out[item.name]
        if item.harmless is not None and item.harmless(value):
            del out[item.name]
            note = f" ({item.harmless_note})" if item.harmless_note else ""
            warn_at_caller(
                f"{model.__name__}({item.name}={value!r}) comes from the published "
                f"dagster-slurm package; leave it out{note}. It is accepted for now and "
                "will be refused in a later release",
                DeprecationWarning,
            )
        else:
            refused.append((item.name, value, item.advice(value)))
    if refused:
        raise WithdrawnFieldError(model.__name__, refused)
    return out


def _problem(detail: Mapping[str, Any], leaf: str) -> tuple[str, ConfigurationError | None]:
    cause = (detail.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigurationError):
        return cause.problem, cause
    text = str(cause) if cause is not None else str(detail.get("msg", ""))
    if text.startswith(f"{leaf}=") and ": " in text:
        text = text.split(": ", 1)[1]
    return text, None


def in_given_words(error: ValidationError, moved: Sequence[Moved]) -> Exception:
    """The first problem of ``error`` that concerns a value given under a published name,
    as a :class:`ConfigurationError` naming that name and the value as given; ``error``
    itself when none does."""
    for detail in error.errors():
        loc = tuple(str(part) for part in detail.get("loc", ()))
        for item in moved:
            problem, cause = _problem(detail, item.path[-1])
            at_field = loc[: len(item.path)] == item.path
            about_field = loc == item.path[:-1] and cause is not None and cause.field == item.path[-1]
            if at_field or about_field:
                return ConfigurationError(
                    item.old, item.value,
                    f"{problem} ({item.old} sets {'.'.join(item.path)})",
                )
    return error


def _as_validation_error(model: type[BaseModel], data: Mapping[str, Any],
                         cause: ConfigurationError) -> ValidationError:
    return ValidationError.from_exception_data(
        model.__name__,
        [{"type": "value_error", "loc": (), "input": dict(data), "ctx": {"error": cause}}],
    )


class PublishedNames:
    """Mixin, listed first, for Dagster resources whose ``renamed_fields`` or
    ``withdrawn_fields`` hold names of the published package: the names are moved (or
    dropped) before Dagster's constructor records the resource's configuration (it keeps
    only the keywords given, by their field names, so a value under an old name would
    otherwise be lost when Dagster rebuilds the resource). Errors are those of
    :class:`KnownFieldsOnly`, in a ``ValidationError``.
    """

    @classmethod
    def move_published_values(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Hook for published values that are not a plain rename (an option inside a list
        that sets a field of its own): ``data`` with them moved to today's fields; raises
        :class:`ConfigurationError` for one that cannot be moved. Default: unchanged."""
        return data

    def __init__(self, **data: Any) -> None:
        model = type(self)
        try:
            data = self.move_published_values(dict(data))
            renamed, moved = accept_renamed_fields(model, data)  # type: ignore[arg-type]
            renamed = drop_withdrawn_fields(model, renamed)  # type: ignore[arg-type]
        except ConfigurationError as error:
            raise _as_validation_error(model, data, error) from None  # type: ignore[arg-type]
        try:
            super().__init__(**renamed)
        except ValidationError as error:
            converted = in_given_words(error, moved)
            if converted is error or not isinstance(converted, ConfigurationError):
                raise
            raise _as_validation_error(model, data, converted) from None  # type: ignore[arg-type]


class KnownFieldsOnly(BaseModel):
    """Mixin for pydantic (Dagster) configuration classes: unknown keywords are errors.

    List it after the Dagster base class: ``class X(Config, KnownFieldsOnly)``. A class
    lists the published package's names it still accepts in ``renamed_fields`` (a class
    attribute, not configuration; see :class:`RenamedField`), those it refuses with
    advice in ``withdrawn_fields`` (see :class:`WithdrawnField`) and those it refuses with
    advice in ``removed_fields`` (name -> what to use instead).
    """

    model_config = ConfigDict(extra="forbid")

    renamed_fields: ClassVar[tuple[RenamedField, ...]] = ()
    withdrawn_fields: ClassVar[tuple[WithdrawnField, ...]] = ()
    removed_fields: ClassVar[Mapping[str, str]] = {}
    #: Dagster infers this class's config schema once, not at every construction
    #: (:mod:`dagster_slurm.schema_cache`).
    config_schema_cached: ClassVar[bool] = True

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "dagster" in sys.modules:  # a Dagster class: its constructor infers the schema
            from dagster_slurm.schema_cache import install

            install()

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_unknown_fields(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        data, moved = accept_renamed_fields(cls, data)
        data = drop_withdrawn_fields(cls, data)
        data = refuse_unknown_fields(cls, data)
        if not moved:
            return handler(data)
        try:
            return handler(data)
        except ValidationError as error:
            converted = in_given_words(error, moved)
            if converted is error:
                raise
            raise converted from None
