"""Asset-scope jobs as the orphan reconciliation sees them: their records and the judgement.

Every asset-scope invocation keeps, under ``<base>/runs/<run>/<step>/<invocation>/``, its
token record ``job.json`` (``/job``: token, job id, ``submitted_at`` by the login node's
clock, and the ``run_id``, ``step_key`` and ``job_name`` of the step that submitted it) and
its ``heartbeat`` file, rewritten by every status poll of the waiting step (first word: the
epoch seconds of the step's machine). The reconciliation reads both in the round trip that
reads the session documents.

A job is an orphan when its Dagster run has ended (SUCCESS, FAILURE, CANCELED, or
CANCELING) while the job is still queued or running, or when its run is unfinished but no
poll has written the heartbeat, and the run has written no event, for ``heartbeat_timeout``
seconds (the step's process died). Jobs of runs the instance does not know are left alone;
records without a job id (a submission whose answer was lost) are left to the job's own
dead-man's switch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dagster_slurm.session.orphans.runs import FINISHED, UNFINISHED, quiet_for, run_of, status_of

RUNS_DIR = "runs"
RECORD_NAME = "job.json"
HEARTBEAT_NAME = "heartbeat"
#: Where a record sits below ``<base>/runs``: run, step, invocation, file.
RECORD_DEPTH = 4
#: Run statuses after which an asset job still queued is cancelled (the run is not failed).
ENDED = FINISHED | {"CANCELING"}


@dataclass(frozen=True)
class AssetJobRecord:
    """One asset-scope job as read from its record and heartbeat file.

    ``path``: the record on the cluster. ``job_id``: None when the submission's answer was
    lost. ``submitted_at``: the login node's clock at the submission (None if unknown).
    ``heartbeat_at``: the first word of the heartbeat file, the waiting step's machine's
    clock at its last poll (None when missing or unreadable). ``now``: the login node's
    clock at the read.
    """

    path: str
    run_id: str
    step_key: str
    job_name: str
    job_id: str | None
    submitted_at: float | None
    heartbeat_at: float | None
    now: float

    @property
    def heartbeat_path(self) -> str:
        return heartbeat_path_of(self.path)


def heartbeat_path_of(record_path: str) -> str:
    """The heartbeat file next to the record ``record_path``."""
    return f"{record_path.rsplit('/', 1)[0]}/{HEARTBEAT_NAME}"


def is_record_path(path: str, runs_root: str) -> bool:
    """Whether ``path`` (a line of the listing) is an asset job record below ``runs_root``."""
    prefix = runs_root.rstrip("/") + "/"
    if not path.startswith(prefix):
        return False
    parts = path[len(prefix):].split("/")
    return len(parts) == RECORD_DEPTH and all(parts) and parts[-1] == RECORD_NAME


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def parse_heartbeat(data: bytes | str | None) -> float | None:
    """The epoch seconds at the start of a heartbeat file's text (None when unreadable)."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    words = (data or "").split()
    try:
        return float(words[0]) if words else None
    except ValueError:
        return None


def parse_record(path: str, doc: Mapping[str, Any] | None, heartbeat: bytes | str | None,
                 now: float) -> AssetJobRecord | None:
    """The record at ``path`` (its document ``doc``, its heartbeat file's text), or None
    when it does not name its run, step and job name (records of older versions)."""
    job = (doc or {}).get("job")
    if not isinstance(job, Mapping):
        return None
    run_id, step_key, job_name = job.get("run_id"), job.get("step_key"), job.get("job_name")
    if not all(isinstance(v, str) and v for v in (run_id, step_key, job_name)):
        return None
    job_id = job.get("job_id")
    return AssetJobRecord(
        path, str(run_id), str(step_key), str(job_name),
        str(job_id) if isinstance(job_id, (str, int)) and str(job_id) else None,
        _number(job.get("submitted_at")), parse_heartbeat(heartbeat), now,
    )


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s ago"


def judge_asset_job(instance: Any, record: AssetJobRecord, heartbeat_timeout: float,
                    clock: Callable[[], float] = time.time) -> tuple[str, Any] | None:
    """``(reason, run to mark failed or None)`` when ``record``'s job is a candidate orphan;
    None when it is not. Raises :class:`~dagster_slurm.session.orphans.runs.Unknown` when the
    instance cannot tell (the caller keeps the job and logs why).

    The heartbeat's age is measured by ``clock`` (this machine's, as the age of the run's
    last event is); the submission's by the login node's clock at the read.
    """
    if record.job_id is None:
        return None
    run = run_of(instance, record.run_id)
    if run is None:
        return None  # another deployment's run: not ours to judge
    status = status_of(run)
    if status in ENDED:
        return f"the run is {status} but its Slurm job is still queued", None
    if status not in UNFINISHED:
        return None
    ages = []
    if record.heartbeat_at is not None:
        ages.append(max(0.0, clock() - record.heartbeat_at))
    if record.submitted_at is not None:
        ages.append(max(0.0, record.now - record.submitted_at))
    last = min(ages) if ages else None
    if last is not None and last <= heartbeat_timeout:
        return None
    quiet = quiet_for(instance, record.run_id, clock)
    if quiet is not None and quiet <= heartbeat_timeout:
        return None  # the run still writes events
    return (f"no status poll by its step since {_age(last)} "
            f"(limit {heartbeat_timeout:g} s)"), run
