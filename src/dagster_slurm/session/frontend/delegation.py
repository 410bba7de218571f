"""Resource methods that delegate to the run's ``RunSession``, with its signature.

``SlurmSessionResource.submit_successor(context, config)`` is
``RunSession.submit_successor(config, logger=context.log)`` on the context's run session. A
method made by :func:`session_method` takes the session method's parameters after
``context``, with the same names, kinds and defaults (read from the session method itself,
so a parameter added there appears on the resource too, and no default is written twice),
and passes the context's log as ``logger`` when the session method takes one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from dagster_slurm.session.session import RunSession


def session_method(name: str, resource_name: str | None = None) -> Callable[..., Any]:
    """A resource method (``self, context, ...``) calling ``RunSession.<name>`` on
    ``self.get_session(context)``; ``resource_name``: the resource method's name when it
    differs (its docstring says which session method it calls)."""
    target = getattr(RunSession, name)
    signature = inspect.signature(target)
    takes_logger = "logger" in signature.parameters
    params = [p for p in signature.parameters.values() if p.name not in ("self", "logger")]

    @functools.wraps(target)
    def method(self: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
        if takes_logger:
            kwargs["logger"] = getattr(context, "log", None)
        return getattr(self.get_session(context), name)(*args, **kwargs)

    context = inspect.Parameter("context", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_param, context, *params])
    method.__name__ = resource_name or name
    method.__qualname__ = f"SlurmSessionResource.{resource_name or name}"
    method.__doc__ = (f"``RunSession.{name}`` on the session of ``context``'s run"
                      + (", logging to ``context.log``" if takes_logger else "")
                      + f".\n\n{inspect.getdoc(target) or ''}")
    return method
