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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
_CACHE: dict[tuple[type, frozenset[str]], Any] = {}
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
        return schema

    infer_once.__wrapped__ = infer  # type: ignore[attr-defined]
    return infer_once


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
        _installed = True


def clear() -> None:
    """Forget every cached schema (a class redefined under the same object, in tests)."""
    with _LOCK:
        _CACHE.clear()
