"""Where a run session keeps its files on the cluster (pure).

Layout under ``<base>/sessions/<run id>-<config digest>/``::

    allocation.json            the session document (see dagster_slurm.state.schema)
    lock                       its lock directory
    heartbeat                  rewritten by the supervisors; its content feeds the dead-man's switch
    allocation-<job id>.log    the allocation's batch output (Ray start, step server)
    submit/<token>/            the allocation's batch script and step server, per submission
    jobs/<job id>/             per allocation: nodes, ready, drained, requests/, steps/,
                               wake (the step server's wake FIFO)
    jobs/<job id>/steps/<step>/<invocation>/   one compute.run: Pipes files, status, drain
    jobs/<job id>/calls/<step>/<n>.json        which invocation the step's call n uses, while
                                               its outcome is unread (dagster_slurm.session.frontend.reattach)
    ray_head                   the run's current Ray head (job_id, ray_address, host, written_at
                               lines): the session's worker allocations join it and follow it
    jobs/<worker job id>/      per worker allocation: nodes, ray_nodes, state, drain

The document, its lock and the heartbeat stay at the same place across allocations, so a
restarted process finds the session (and any successor) from the run id alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dagster_slurm.jobs.paths import InvocationPaths, safe_name

SESSIONS_DIR = "sessions"


def session_name(run_id: str, digest: str = "") -> str:
    """The session's directory name: the run id, plus the digest of its configuration
    (two run-scoped resources with different shapes in one run get two sessions)."""
    return safe_name(run_id, 64) + (f"-{safe_name(digest, 16)}" if digest else "")


def session_job_name(run_id: str, digest: str = "") -> str:
    """``dsr-<session name>``: the Slurm job name of every allocation of the session."""
    return f"dsr-{session_name(run_id, digest)}"


@dataclass(frozen=True)
class SessionPaths:
    """Paths of one run session on the cluster."""

    base: str
    session_dir: str

    @classmethod
    def create(cls, base: str, run_id: str, digest: str = "") -> SessionPaths:
        base = base.rstrip("/")
        return cls(base, f"{base}/{SESSIONS_DIR}/{session_name(run_id, digest)}")

    @property
    def sessions_root(self) -> str:
        return f"{self.base}/{SESSIONS_DIR}"

    @property
    def document(self) -> str:
        return f"{self.session_dir}/allocation.json"

    @property
    def lock(self) -> str:
        return f"{self.session_dir}/lock"

    @property
    def heartbeat(self) -> str:
        return f"{self.session_dir}/heartbeat"

    @property
    def output(self) -> str:
        """The allocation's batch output; ``%j`` is the job id (Slurm fills it in)."""
        return f"{self.session_dir}/allocation-%j.log"

    def output_of(self, job_id: str) -> str:
        return f"{self.session_dir}/allocation-{job_id}.log"

    def submit_dir(self, token: str) -> str:
        return f"{self.session_dir}/submit/{token}"

    def job_dir(self, job_id: str) -> str:
        return f"{self.session_dir}/jobs/{job_id}"

    def ready(self, job_id: str) -> str:
        return f"{self.job_dir(job_id)}/ready"

    def nodes(self, job_id: str) -> str:
        return f"{self.job_dir(job_id)}/nodes"

    def drained(self, job_id: str) -> str:
        return f"{self.job_dir(job_id)}/drained"

    def request(self, job_id: str, request_id: str, suffix: str = "request") -> str:
        return f"{self.job_dir(job_id)}/requests/{request_id}.{suffix}"

    def wake(self, job_id: str) -> str:
        """Allocation ``job_id``'s wake FIFO: its step server waits on it between two
        listings of ``requests/``; one line written to it ends the wait (a reader exists
        only on the server's host; see ``templates/session_server.sh``)."""
        return f"{self.job_dir(job_id)}/wake"

    def steps_dir(self, job_id: str) -> str:
        return f"{self.job_dir(job_id)}/steps"

    def invocation(self, job_id: str, step_key: str, invocation: str | None = None) -> InvocationPaths:
        """The files of one step invocation inside allocation ``job_id`` (``invocation``:
        its directory name; None: a new one)."""
        return InvocationPaths.create_under(self.steps_dir(job_id), self.base, step_key, invocation)

    def calls_dir(self, job_id: str, step_key: str) -> str:
        """The directory of step ``step_key``'s call records in allocation ``job_id``."""
        return f"{self.job_dir(job_id)}/calls/{safe_name(step_key, 100)}"

    def call_record(self, job_id: str, step_key: str, index: int) -> str:
        """The record of call ``index`` (0: the first ``compute.run`` of an attempt) of
        step ``step_key`` in allocation ``job_id``: which invocation it uses."""
        return f"{self.calls_dir(job_id, step_key)}/{int(index)}.json"

    @property
    def ray_head(self) -> str:
        """The file naming the run's current Ray head, which worker allocations follow."""
        return f"{self.session_dir}/ray_head"

    def ray_nodes(self, job_id: str) -> str:
        """Worker allocation ``job_id``'s joined nodes: ``<host> <ray node id> <head job id>``
        per line, rewritten atomically whenever a node joins or leaves."""
        return f"{self.job_dir(job_id)}/ray_nodes"

    def worker_state(self, job_id: str) -> str:
        """Worker allocation ``job_id``'s state word (see ``templates/ray_worker.sh``)."""
        return f"{self.job_dir(job_id)}/state"

    def worker_drain(self, job_id: str) -> str:
        """The drain request of worker allocation ``job_id`` (``deadline=<epoch seconds>``)."""
        return f"{self.job_dir(job_id)}/drain"

    def ray_stopped(self, job_id: str) -> str:
        """Written by head allocation ``job_id``'s step server once its Ray head stopped
        answering while the job runs (epoch seconds)."""
        return f"{self.job_dir(job_id)}/ray_stopped"


def session_digest(queue: Any, config: Any, launcher: Any,
                   environment: Any = None, layout: Any = None) -> str:
    """8 hex digits identifying an allocation's shape, launcher and environment settings
    and, with a ``layout`` (a separate head, a first worker allocation), that layout
    (resources that differ in any of them get separate sessions)."""
    parts = [queue.model_dump(mode="json"), config.snapshot(), type(launcher).__name__,
             launcher.model_dump(mode="json"), environment]
    if layout is not None:
        parts.append(layout.snapshot())
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]
