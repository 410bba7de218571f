"""The Dagster config schema of the library's resources, inferred once per class.

Dagster builds a configurable resource anew for every run (and twice more while it
initialises it: once to bind nested resources, once to bind the init context), and every
construction infers the resource's config schema from its pydantic fields again. For
:class:`~dagster_slurm.ComputeResource`, whose fields nest the Slurm resource, launchers
and allocation shapes, that inference was most of the time Dagster spent initialising the
resource (about 15 ms per construction on the dev machine, three constructions per run).

The schema depends only on the class and on which fields hold nested resources, so it is
the same every time: :func:`install` wraps the function Dagster's resource constructor
calls so that, for classes that set ``config_schema_cached = True`` (every class deriving
from :class:`~dagster_slurm.config_errors.KnownFieldsOnly`), the schema is inferred once
per class and set of omitted fields and reused. Every other class, and every other caller
of the function, goes to Dagster's own inference unchanged. The public fields, their
defaults and descriptions are exactly those Dagster infers (the cached object is the one
it returned).

Each construction then also "curries" that schema with the resource's values (validates
them against it and makes them its defaults), about 1.4 ms for a ``ComputeResource``,
six times per run. :func:`cached_curry` keeps the result for a cached schema and the same
values (compared with their types, so ``1`` is not ``True``), at most
:data:`CURRIED_MAX` of them, least recently used first out; values it cannot compare
(anything but ``None``, strings, numbers, lists and string-keyed dicts of them) and every
other schema go to Dagster each time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

#: Most curried schemas kept (one per resource class and distinct values, in practice a
#: handful per code location).
CURRIED_MAX = 256

_LOCK = threading.Lock()
_CACHE: dict[tuple[type, frozenset[str]], Any] = {}
#: id of a cached schema -> the schema (kept alive, so that the id is not reused).
_SCHEMAS: dict[int, Any] = {}
_CURRIED: OrderedDict[tuple[int, Hashable], Any] = OrderedDict()
_installed = False


def cached_schema(infer: Callable[..., Any]) -> Callable[..., Any]:
    """``infer`` (Dagster's ``infer_schema_from_config_class``) with a per-class cache for
    classes that set ``config_schema_cached``; calls with a description or a default, and
    other classes, go to ``infer`` each time."""

    def infer_once(model_cls: type, description: str | None = None,
                   fields_to_omit: set[str] | None = None, default: Any = None) -> Any:
        if description is not None or default is not None or \
                not getattr(model_cls, "config_schema_cached", False):
            return infer(model_cls, description=description, fields_to_omit=fields_to_omit,
                         default=default)
        key = (model_cls, frozenset(fields_to_omit or ()))
        schema = _CACHE.get(key)
        if schema is None:
            schema = infer(model_cls, fields_to_omit=fields_to_omit)
            with _LOCK:
                schema = _CACHE.setdefault(key, schema)
                _SCHEMAS[id(schema)] = schema
        return schema

    infer_once.__wrapped__ = infer  # type: ignore[attr-defined]
    return infer_once


_SCALARS = (str, int, float, bool, type(None))


def _frozen(value: Any) -> Hashable | None:
    """A hashable copy of a config value that compares equal only to the same value of
    the same types; None when the value holds anything else."""
    if isinstance(value, _SCALARS):
        return (type(value), value)
    if isinstance(value, list):
        items = [_frozen(item) for item in value]
        return None if any(item is None for item in items) else (list, tuple(items))
    if isinstance(value, dict) and all(type(key) is str for key in value):
        pairs = [(key, _frozen(item)) for key, item in value.items()]
        if any(item is None for _, item in pairs):
            return None
        return (dict, tuple(sorted(pairs)))
    return None


def cached_curry(curry: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``curry`` (Dagster's ``_curry_config_schema``: a schema with ``data`` validated
    against it and made its defaults) with a cache for schemas from :func:`cached_schema`;
    other schemas, and values :func:`_frozen` cannot compare, go to ``curry`` each time. A
    call that raises (values the schema refuses) is not cached."""

    def curry_once(schema_field: Any, data: Any) -> Any:
        if _SCHEMAS.get(id(schema_field)) is not schema_field:
            return curry(schema_field, data)
        frozen = _frozen(data)
        if frozen is None:
            return curry(schema_field, data)
        key = (id(schema_field), frozen)
        with _LOCK:
            curried = _CURRIED.get(key)
            if curried is not None:
                _CURRIED.move_to_end(key)
                return curried
        curried = curry(schema_field, data)
        with _LOCK:
            _CURRIED[key] = curried
            while len(_CURRIED) > CURRIED_MAX:
                _CURRIED.popitem(last=False)
        return curried

    curry_once.__wrapped__ = curry  # type: ignore[attr-defined]
    return curry_once


def install() -> None:
    """Route the schema inference of Dagster's resource constructor through
    :func:`cached_schema` (once per process; idempotent)."""
    global _installed
    with _LOCK:
        if _installed:
            return
        from dagster._config.pythonic_config import resource as dagster_resource

        dagster_resource.infer_schema_from_config_class = cached_schema(  # type: ignore[attr-defined]
            dagster_resource.infer_schema_from_config_class)
        dagster_resource._curry_config_schema = cached_curry(  # type: ignore[attr-defined]
            dagster_resource._curry_config_schema)
        _installed = True


def clear() -> None:
    """Forget every cached schema (a class redefined under the same object, in tests)."""
    with _LOCK:
        _CACHE.clear()
        _SCHEMAS.clear()
        _CURRIED.clear()
