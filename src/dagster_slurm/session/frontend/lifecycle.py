"""Which run sessions this process uses, and whether a teardown ends the run's allocation.

A resource's teardown runs once per process that initialised it: once per run with the
in-process executor, once per step process with the multiprocess executor. A step process
cannot cancel the run's allocation just because its own step is done (the next step would
need a new allocation), so :func:`run_is_over` asks the Dagster instance: the run has a
final or cancelling status, or every planned step has finished (success, failure or
skipped) or can never start (it depends on a failed step). When a step process leaves while the run goes on, its heartbeat stops; the
allocation then lives on for the next step, and ends by its dead-man's switch
(``heartbeat_timeout``) if no step comes.

When the instance cannot be read, the answer is unknown and the allocation is kept: a
teardown never cancels an allocation other steps may still need on a guess. The run's
last teardown, the orphan sensor or the dead-man's switch ends it later.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.contexts import run_id_of
from dagster_slurm.jobs.follow import DEFAULT_RUN_STATUS_INTERVAL, RunFollower
from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.paths import session_digest
from dagster_slurm.session.head.layout import RunLayout, head_request
from dagster_slurm.session.session import RunSession

log = logging.getLogger("dagster_slurm.session")

_SESSIONS: dict[tuple[int, str], RunSession] = {}
_SESSIONS_LOCK = threading.Lock()


def session_for(key: str, factory: Callable[[], RunSession]) -> RunSession:
    """This process's session for ``key`` (its session directory), created on first use."""
    with _SESSIONS_LOCK:
        entry = (os.getpid(), key)
        session = _SESSIONS.get(entry)
        if session is None:
            session = factory()
            _SESSIONS[entry] = session
        return session


def run_session_for(
    owner: Any,
    context: Any,
    config: SlurmRunAllocationConfig,
    launcher: ComputeLauncher,
    *,
    pending: Any = None,
    poll_interval: float = 0.25,
    run_status_interval: float = DEFAULT_RUN_STATUS_INTERVAL,
    session_class: type[RunSession] = RunSession,
    layout: RunLayout | None = None,
) -> RunSession:
    """This process's session of the context's run for ``owner``'s settings (a resource with
    ``slurm``, ``pre_deployed_env_path``, ``env_packages`` and ``auto_detect_platform``),
    created on first use; nothing is submitted here. The environment is prepared on the
    session's first need (:func:`~dagster_slurm.jobs.activation.activation_for`). Its waits
    follow the run (:class:`~dagster_slurm.jobs.follow.RunFollower` of the context's instance,
    every ``run_status_interval`` seconds): they stop once the run is no longer running.
    ``session_class``: the class built (a subclass of :class:`RunSession` with site-specific
    extension points; it takes :class:`RunSession`'s constructor arguments). ``layout``: a
    separate head or a first worker allocation (:mod:`dagster_slurm.session.head.layout`);
    ``config`` is then the head allocation's configuration."""
    from dagster_slurm.jobs.activation import activation_for
    from dagster_slurm.session.head.run_tag import publish_run_tag

    run_id = run_id_of(context)
    if run_id is None:
        raise ConfigurationError("context", context, "is not the context of a Dagster run")
    slurm = owner.slurm
    environment = [owner.pre_deployed_env_path, owner.env_packages]
    digest = session_digest(head_request(config, slurm.queue, layout), config, launcher,
                            environment, layout)
    # a layout is passed only when there is one: session classes of sites may predate it
    extra: dict[str, Any] = {} if layout is None else {"layout": layout}

    def factory() -> RunSession:
        follower = RunFollower(getattr(context, "instance", None), run_id,
                               interval=run_status_interval)
        session = session_class(
            slurm, run_id, config, launcher, activation=lambda: activation_for(owner, context),
            pending=pending, poll_interval=poll_interval, environment=environment,
            follow=follower.check, **extra,
        )
        session.publish_allocation = lambda job_id: publish_run_tag(context, job_id)
        return session

    return session_for(f"{slurm.base_path()}|{run_id}|{digest}", factory)


def sessions_of_run(run_id: str) -> list[RunSession]:
    """This process's open sessions of ``run_id``, removed from the registry."""
    with _SESSIONS_LOCK:
        keys = [k for k, s in _SESSIONS.items() if k[0] == os.getpid() and s.run_id == run_id]
        return [_SESSIONS.pop(k) for k in keys]


_FINAL_RUN_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELING", "CANCELED"})
_FINISHED_STEP_STATUSES = frozenset({"SUCCESS", "FAILURE", "SKIPPED"})


def _downstream_of(snapshot: Any, failed: set[str]) -> set[str]:
    """Steps of the plan that depend, directly or not, on a step in ``failed`` (Dagster
    gives such steps no status when it abandons them)."""
    if not failed:
        return set()
    upstream: dict[str, set[str]] = {}
    for step in snapshot.steps:
        keys = upstream.setdefault(step.key, set())
        for step_input in getattr(step, "inputs", None) or ():
            for handle in getattr(step_input, "upstream_output_handles", None) or ():
                keys.add(handle.step_key)
    doomed: set[str] = set()
    changed = True
    while changed:
        changed = False
        for key, deps in upstream.items():
            if key not in doomed and deps & (failed | doomed):
                doomed.add(key)
                changed = True
    return doomed


def run_is_over(instance: Any, run_id: str | None) -> tuple[bool | None, str]:
    """``(over, why)``: whether the Dagster run ``run_id`` will start no further step.

    ``over`` is True when the run will start no further step, False while steps remain,
    and None when the instance could not be read (unknown: never a reason to cancel).
    Without an instance or run id (a resource used outside a run) the answer is "over": the
    process that opened the session is the only one that knows about it.
    """
    if instance is None or not run_id:
        return True, "no Dagster run to consult"
    try:
        run = instance.get_run_by_id(run_id)
        if run is None:
            return True, f"run {run_id} is unknown to the instance"
        status = getattr(run.status, "value", str(run.status))
        if status in _FINAL_RUN_STATUSES:
            return True, f"the run is {status}"
        snapshot = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        planned = set(snapshot.step_keys_to_execute or [step.key for step in snapshot.steps])
        statuses = {
            stats.step_key: getattr(stats.status, "value", None)
            for stats in instance.get_run_step_stats(run_id)
        }
        finished = {key for key, value in statuses.items() if value in _FINISHED_STEP_STATUSES}
        failed = {key for key, value in statuses.items() if value == "FAILURE"}
        finished |= _downstream_of(snapshot, failed)  # never started: their upstream failed
    except Exception as exc:  # noqa: BLE001 - unknown, reported as None and logged by the caller
        return None, f"the run's state could not be read ({type(exc).__name__}: {exc})"
    remaining = planned - finished
    if not remaining:
        return True, "every step of the run has finished"
    return False, f"{len(remaining)} step(s) of the run have not finished"


def close_run_sessions(context: Any) -> None:
    """Teardown of a resource in this process: close its sessions of the current run,
    cancelling their allocations when the run is over or this process was interrupted."""
    run_id = run_id_of(context)
    if run_id is None:
        return
    sessions = sessions_of_run(run_id)
    if not sessions:
        return
    over, why = run_is_over(getattr(context, "instance", None), run_id)
    logger = getattr(context, "log", None)
    for session in sessions:
        if session.interrupted:
            session.close(cancel=True, reason="the step was interrupted", logger=logger)
        elif over:
            session.close(cancel=True, reason=why, logger=logger)
        elif over is None:
            session.close(cancel=False)
            _tell(logger, "warning",
                  f"Run allocation of {session.job_name} kept: whether the run is over is "
                  f"unknown ({why}); it ends with a later teardown of the run, the orphan "
                  f"sensor, or {_switch(session)}")
        else:
            session.close(cancel=False)
            _tell(logger, "info",
                  f"Run allocation of {session.job_name} kept for the run's other steps ({why}); "
                  f"it ends with the run, or {_switch(session)}")


def _switch(session: RunSession) -> str:
    """How the session's dead-man's switch ends it, in words."""
    timeout = session.config.heartbeat_timeout
    if timeout is None:
        return "by hand (`scancel`): its dead-man's switch is off (heartbeat_timeout=None)"
    return f"{timeout} s after the last heartbeat"


def _tell(logger: Any, level: str, message: str) -> None:
    """``message`` to the Dagster ``logger`` when there is one, and always to this module's log."""
    getattr(log, level)(message)
    if logger is not None:
        getattr(logger, level)(message)
