"""The batch script of a queued successor allocation: its standby (pure rendering).

``templates/successor_standby.sh`` after the common job prologue (``templates/job_common.sh``,
whose traps record the drain signal): once Slurm starts the successor, the script waits for
its promotion, starting nothing, and then becomes the allocation's start script. A drain
signal that arrives before the promotion is recorded in ``jobs/<job id>/drained`` (the file
the step server writes on a drain) and the standby keeps waiting; the promoted allocation's
step server finds that file and answers every step drained. See the template's header.
"""

from __future__ import annotations

from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.script import render_prologue, render_template
from dagster_slurm.session.core.paths import SessionPaths

STANDBY_TEMPLATE = "successor_standby.sh"
#: The prologue's payload words: the program that runs the start script once promoted.
STANDBY_RUNNER = ("bash",)


def standby_plan(paths: SessionPaths, token: str, drain_signal: str) -> ExecutionPlan:
    """The prologue's plan for the standby of submission ``token``: its files in the
    submission's directory (``standby_status``, ``standby_drain_signal``), no activation, no
    environment and no watchdog of the prologue's own (the standby has its heartbeat check)."""
    submit_dir = paths.submit_dir(token)
    return ExecutionPlan(
        payload=STANDBY_RUNNER, job_dir=submit_dir, status_file=f"{submit_dir}/standby_status",
        drain_file=f"{submit_dir}/standby_drain_signal", mode="slurm", drain_signal=drain_signal,
    )


def render_standby(paths: SessionPaths, token: str, drain_signal: str,
                   heartbeat_timeout: float | None) -> str:
    """The standby script of successor submission ``token``; ``drain_signal`` is the
    allocation's (``USR1``; ``TERM`` without a configured pre-walltime signal),
    ``heartbeat_timeout`` the seconds its dead-man's switch allows (None: no limit)."""
    return render_template(
        STANDBY_TEMPLATE,
        {
            "start_file": f"{paths.submit_dir(token)}/start",
            "session_dir": paths.session_dir,
            "heartbeat_file": paths.heartbeat,
            "heartbeat_timeout": "" if heartbeat_timeout is None else str(int(heartbeat_timeout)),
        },
        {"prologue": render_prologue(standby_plan(paths, token, drain_signal), launcher="standby")},
    )
