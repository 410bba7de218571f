"""Payload of the relay example: process work units, commit each one on the shared
filesystem, and stop at a unit boundary when the allocation drains.

Pipes extras: ``work_dir`` (the commit directory, on a filesystem every allocation sees),
``units`` (how many units the whole job has) and ``unit_seconds`` (simulated work per
unit). The drain signal's name comes from the environment variable ``DRAIN_SIGNAL``
(``TERM`` unless set), so that the handler is installed before anything else happens.

Reports (Pipes custom messages): ``{"unit": n, "job": id}`` for each unit this run
committed, ``{"unit": n, "job": id, "duplicate": true}`` for a unit some other run had
committed first, and last ``{"remaining": n, "processed": n, "drained": bool, "job": id}``:
the completion report the asset decides on.
"""

import os
import signal

drained: list[int] = []


def _on_drain(signum, frame):  # noqa: ANN001, ARG001 - a signal handler's signature
    drained.append(signum)
    # The drain comes once, but a cancellation or the walltime may send the same signal
    # later: ignore the rest, so that a late copy cannot end the payload on its way out
    # with the default action (terminate).
    signal.signal(signum, signal.SIG_IGN)


# First thing: a drain that arrives before the handler exists would end the process.
signal.signal(getattr(signal, "SIG" + os.environ.get("DRAIN_SIGNAL", "TERM")), _on_drain)

import hashlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from dagster_pipes import open_dagster_pipes  # noqa: E402


def commit_path(work_dir: str, unit: int) -> str:
    return os.path.join(work_dir, f"unit-{unit:05d}.json")


def process(unit: int, seconds: float) -> str:
    """The unit's work (here: a digest, and time spent as a stand-in for real work)."""
    time.sleep(seconds)
    return hashlib.sha256(f"unit-{unit}".encode()).hexdigest()


def commit(work_dir: str, unit: int, record: dict) -> bool:
    """Publish the unit's result at once and at most once: written to a private file, then
    hard-linked to its final name, which fails if that name exists. False: the unit had
    been committed already (by another run), and this result is dropped."""
    final = commit_path(work_dir, unit)
    partial = f"{final}.{os.getpid()}.partial"
    with open(partial, "w") as handle:
        json.dump(record, handle)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(partial, final)
    except FileExistsError:
        return False
    finally:
        os.unlink(partial)
    return True


def main() -> None:
    with open_dagster_pipes() as pipes:
        work_dir = pipes.extras["work_dir"]
        units = int(pipes.extras["units"])
        seconds = float(pipes.extras.get("unit_seconds", 1.0))
        job = os.environ.get("SLURM_JOB_ID", "local")
        os.makedirs(work_dir, exist_ok=True)
        processed = 0
        for unit in range(units):
            if drained:
                break  # the unit before this one is committed: a safe boundary
            if os.path.exists(commit_path(work_dir, unit)):
                continue  # done by an earlier allocation
            result = process(unit, seconds)
            if commit(work_dir, unit, {"unit": unit, "job": job, "result": result}):
                processed += 1
                pipes.report_custom_message({"unit": unit, "job": job})
            else:
                pipes.report_custom_message({"unit": unit, "job": job, "duplicate": True})
        remaining = sum(not os.path.exists(commit_path(work_dir, u)) for u in range(units))
        pipes.log.info(f"processed {processed} unit(s) in job {job}; {remaining} remaining"
                       + (" (drained)" if drained else ""))
        pipes.report_custom_message({"remaining": remaining, "processed": processed,
                                     "drained": bool(drained), "job": job})


if __name__ == "__main__":
    main()
