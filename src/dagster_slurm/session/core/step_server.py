"""The step server script of one submission (``templates/session_server.sh``), rendered."""

from __future__ import annotations

from dagster_slurm.launchers.script import render_template
from dagster_slurm.session.core.paths import SessionPaths

SERVER_TEMPLATE = "session_server.sh"


def render_server(paths: SessionPaths, token: str, drain_signal: str,
                  heartbeat_timeout: float | None) -> str:
    """The step server of the submission ``token``: it serves the session's step requests
    in the allocation, forwards ``drain_signal`` and stops once the heartbeat file is
    unchanged for ``heartbeat_timeout`` seconds (None: never)."""
    return render_template(SERVER_TEMPLATE, {
        "session_dir": paths.session_dir,
        "heartbeat_file": paths.heartbeat,
        "heartbeat_timeout": "" if heartbeat_timeout is None else str(int(heartbeat_timeout)),
        "drain_signal": drain_signal,
        "launch_dir": paths.submit_dir(token),
    })
