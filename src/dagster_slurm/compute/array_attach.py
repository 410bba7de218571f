"""A retried step finds the job array an earlier attempt of it submitted (one round trip).

A step process that was killed (SIGKILL, a lost node of the run worker) leaves its array
running; when Dagster retries the step in the same run (an op ``RetryPolicy``), the new
attempt attaches to that array instead of submitting a second one, so no key runs twice.
The earlier attempt's submission record (``job.json`` in its invocation directory) names the
array and a digest of the run's keys; an attempt that ended (successfully, with failed
tasks, or cancelled) leaves a ``finished`` file next to it and is not attached to.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dagster_slurm.agent import ScanSpec, scan_op

__all__ = ["FINISHED_FILE", "EarlierArray", "find_earlier_array", "keys_digest"]

#: Written next to the submission record when the attempt that submitted the array ended.
FINISHED_FILE = "finished"


def keys_digest(keys: Sequence[str]) -> str:
    """A digest of the run's partition keys in order (an attempt attaches only to the array
    of the same keys)."""
    return hashlib.sha256(json.dumps(list(keys)).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class EarlierArray:
    """The array of an earlier attempt of the step: its job id and invocation directory."""

    job_id: str
    job_dir: str


def find_earlier_array(agent: Any, step_dir: str, digest: str) -> EarlierArray | None:
    """The array an earlier, unfinished attempt of the step submitted for the same keys
    (``step_dir``: the step's directory under the run's); None when there is none. The
    latest submission wins when there are several."""
    result = agent.run(scan_op([ScanSpec(step_dir, "job.json", 2, sibling=FINISHED_FILE)]))
    found: list[tuple[float, EarlierArray]] = []
    for entry in result.entries:
        job = (entry.doc or {}).get("job") if isinstance(entry.doc, dict) else None
        if not isinstance(job, dict) or job.get("keys_sha256") != digest:
            continue
        if entry.sibling is not None and entry.sibling.exists:
            continue
        job_id = job.get("job_id")
        if not isinstance(job_id, (str, int)) or not str(job_id):
            continue
        when = job.get("submitted_at")
        found.append((float(when) if isinstance(when, (int, float)) else 0.0,
                      EarlierArray(str(job_id), entry.path.rsplit("/", 1)[0])))
    return max(found, key=lambda item: item[0])[1] if found else None
