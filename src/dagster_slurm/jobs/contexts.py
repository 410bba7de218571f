"""The Dagster contexts the library is given, and what it reads from them.

Dagster hands the function of a step one of three context types; ``compute.run`` and
``run_hetjob`` accept each of them, and :func:`op_context` reduces it to the one the library
works with:

=======================================  ===================================  =============================
Step                                     Context Dagster passes               Becomes
=======================================  ===================================  =============================
``@asset``, ``@multi_asset``             ``AssetExecutionContext``            its ``op_execution_context``
``@asset_check``                         ``AssetCheckExecutionContext``       its ``op_execution_context``
``@op`` in a ``@job``                    ``OpExecutionContext``               itself
op of a ``@graph_asset``                 ``OpExecutionContext``               itself
any step whose ``context`` is            as annotated                         as above
annotated with another allowed type
=======================================  ===================================  =============================

Everything after the entry point (the Pipes session, the step's identity, its run, log and
retry number) works on that :class:`~dagster.OpExecutionContext`. It is the type Dagster's
``open_pipes_session`` and ``PipesSession.get_results`` read from (``has_assets_def``,
``selected_asset_keys``, ``run_id``, ``job_name``, the step context): an
``AssetCheckExecutionContext`` has none of those, and an ``AssetExecutionContext`` has
some only as deprecated aliases. Nothing is lost: both wrappers delegate to their op
context, which holds the same step. What the payload's Pipes messages become follows from
the step, not from the wrapper: a materialization per asset the step selected (one per key
of a multi-asset), a check result per check of the step (an asset check's own, or an
asset's check specs), and for an op outside any asset neither (logs and custom messages).

The run-scope session getters (``get_run_allocation_session``, ``SlurmSessionResource``'s
methods) read only a context's ``run``, ``instance`` and ``log``, which every type above
has, as does a resource's ``InitResourceContext`` (:func:`run_id_of`); they take any of
them unchanged.
"""

from __future__ import annotations

import logging
from typing import Any, TypeAlias

from dagster import AssetCheckExecutionContext, AssetExecutionContext, OpExecutionContext

from dagster_slurm.errors import ConfigurationError

__all__ = ["ExecutionContext", "op_context", "run_id_of", "step_identity"]

log = logging.getLogger("dagster_slurm.jobs")

#: A context Dagster passes to the function of an asset, multi-asset, asset check or op.
ExecutionContext: TypeAlias = OpExecutionContext | AssetExecutionContext | AssetCheckExecutionContext


def op_context(context: ExecutionContext) -> OpExecutionContext:
    """The :class:`~dagster.OpExecutionContext` of ``context`` (the table of the module
    docstring): an op context itself, an asset or asset-check context its
    ``op_execution_context``.

    Raises :class:`~dagster_slurm.errors.ConfigurationError` naming the type of anything
    else (``None``, a resource's ``InitResourceContext``, another object).
    """
    if isinstance(context, OpExecutionContext):
        return context
    if isinstance(context, (AssetExecutionContext, AssetCheckExecutionContext)):
        return context.op_execution_context
    raise ConfigurationError(
        "context", type(context).__name__,
        "must be the context Dagster passes to an asset, multi-asset, asset check or op "
        "(AssetExecutionContext, AssetCheckExecutionContext or OpExecutionContext)",
    )


def step_identity(context: ExecutionContext) -> tuple[str, str]:
    """``(run_id, step_key)`` of an execution context of any type :func:`op_context`
    takes (read from its step context)."""
    step = op_context(context).get_step_execution_context()
    return step.run_id, step.step.key


def run_id_of(context: Any) -> str | None:
    """The run id of a Dagster execution context (any type), of a resource's
    ``InitResourceContext``, or of any object with ``run`` or ``run_id``; None outside a
    run. ``context.run.run_id`` is asked first (``run_id`` is deprecated on asset contexts
    and missing on asset-check contexts)."""
    try:
        run = context.run
        run_id = getattr(run, "run_id", None)
        if isinstance(run_id, str):
            return run_id
    except Exception as exc:  # noqa: BLE001 - logged; the run id attribute is asked next
        log.debug("context has no readable run (%s: %s); trying its run_id", type(exc).__name__, exc)
    value = getattr(context, "run_id", None)
    return value if isinstance(value, str) else None
