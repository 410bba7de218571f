"""``sbatch --test-only``: how to ask for a start estimate and how to read the answer.

Pure: text in, records out, no I/O. ``sbatch --test-only`` submits nothing (it consumes a
job id); Slurm writes its answer to stderr, for example::

    sbatch: Job 2425 to start at 2026-12-01T21:09:06 using 1 processors on nodes c1 in partition cpu

or, with exit status 1, ``sbatch: error: invalid partition specified: nosuch`` followed by
``allocation failure: Invalid partition name specified``.

sbatch prints the start time in the login node's local time zone, in the format
``SLURM_TIME_FORMAT`` asks for. Run with :data:`TEST_ONLY_ENV` (``TZ=UTC0``,
``SLURM_TIME_FORMAT=standard``) it prints ``YYYY-MM-DDTHH:MM:SS`` in UTC whatever the site's
settings, and :func:`start_epoch` turns that into epoch seconds, comparable with the login
node's clock. The options are read from the command line only: :data:`TEST_ONLY_SCRIPT` is
a batch script without ``#SBATCH`` lines, passed on standard input (sbatch wants a script
or ``--wrap``; the script of a real submission holds no ``#SBATCH`` lines either).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from dagster_slurm.slurm.hostlist import expand_hostlist
from dagster_slurm.slurm.units import parse_int, parse_timestamp

__all__ = [
    "TEST_ONLY_ENV",
    "TEST_ONLY_SCRIPT",
    "TestOnlyResult",
    "parse_test_only",
    "seconds_until_start",
    "start_epoch",
    "unanswered",
]

#: Environment of an ``sbatch --test-only`` call whose start time :func:`start_epoch` reads:
#: UTC (``UTC0`` is a POSIX TZ value, valid without time zone files) in Slurm's standard
#: ``YYYY-MM-DDTHH:MM:SS`` form (overriding a ``SLURM_TIME_FORMAT`` of the login shell).
TEST_ONLY_ENV: Mapping[str, str] = {"TZ": "UTC0", "SLURM_TIME_FORMAT": "standard"}

#: The batch script given on standard input: no ``#SBATCH`` lines, so that only the
#: command line's options describe the request.
TEST_ONLY_SCRIPT = "#!/bin/sh\ntrue\n"


@dataclass(frozen=True)
class TestOnlyResult:
    """What ``sbatch --test-only`` said about a job; fields it did not state are None."""

    __test__ = False  # not a pytest test class, despite the name

    runnable: bool | None
    """True when Slurm gave a start estimate, False when it refused the request, None when
    the output said neither (or no answer came)."""
    job_id: str | None
    """The (consumed, never used) job id of the estimate."""
    start_time: datetime | None
    """Expected start, naive, in the time zone sbatch ran in (UTC with
    :data:`TEST_ONLY_ENV`); may lie in the future when nodes are busy."""
    processors: int | None
    """Processors the job would get."""
    node_list: str | None
    """Nodes it would run on, compact form."""
    nodes: tuple[str, ...] | None
    """``node_list`` expanded."""
    partition: str | None
    """Partition it would run in (the first fitting one of a list)."""
    error: str | None
    """Why it cannot run, e.g. ``Requested node configuration is not available``, or why
    there is no answer (see :func:`unanswered`)."""


_JOB = re.compile(r"\bJob ([0-9]+(?:[_+][0-9]+)?) to start at (\S+)")
_CPUS = re.compile(r"\busing ([0-9]+) processors?\b")
_NODES = re.compile(r"\bon nodes (\S+)")
_PARTITION = re.compile(r"\bin partition (\S+)")
_ALLOCATION_FAILURE = re.compile(r"allocation failure:\s*(.+)")
_SBATCH_ERROR = re.compile(r"sbatch: error:\s*(?:Batch job submission failed:\s*)?(.+)")


def parse_test_only(stderr: object, exit_code: int | None) -> TestOnlyResult:
    """Read ``sbatch --test-only`` output (Slurm writes it to stderr) and its exit code.

    A non-zero ``exit_code`` means not runnable; ``exit_code`` None means unknown, and
    the text alone decides. ``error`` prefers the ``allocation failure:`` message, then the
    last ``sbatch: error:`` message, then (for a non-zero exit) the last line. Never raises.
    """
    text = stderr if isinstance(stderr, str) else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    estimate = next((m for m in map(_JOB.search, lines) if m is not None), None)
    line = estimate.string if estimate is not None else ""
    error = _error(lines, failed=exit_code not in (0, None))
    if exit_code not in (0, None) or (estimate is None and error is not None):
        runnable: bool | None = False
    else:
        runnable = True if estimate is not None else None
    node_list = _group(_NODES, line)
    return TestOnlyResult(
        runnable=runnable,
        job_id=estimate.group(1) if estimate is not None else None,
        start_time=parse_timestamp(estimate.group(2)) if estimate is not None else None,
        processors=parse_int(_group(_CPUS, line)),
        node_list=node_list,
        nodes=expand_hostlist(node_list) if node_list is not None else None,
        partition=_group(_PARTITION, line),
        error=error if runnable is not True else None,
    )


def unanswered(reason: str) -> TestOnlyResult:
    """The result of a call that gave no verdict (it timed out, or could not run):
    ``runnable`` None and ``reason`` as the error."""
    return TestOnlyResult(runnable=None, job_id=None, start_time=None, processors=None,
                          node_list=None, nodes=None, partition=None, error=reason)


def start_epoch(result: TestOnlyResult) -> float | None:
    """The estimated start in epoch seconds, reading ``start_time`` as UTC (right for an
    answer of sbatch run with :data:`TEST_ONLY_ENV`); None without an estimate."""
    if result.runnable is not True or result.start_time is None:
        return None
    return result.start_time.replace(tzinfo=timezone.utc).timestamp()


def seconds_until_start(result: TestOnlyResult, now: float) -> float | None:
    """Seconds from ``now`` (epoch seconds of the login node's clock) to the estimated
    start, 0.0 when it is due already; None without an estimate. The estimate has whole
    seconds, so a job that starts at once reads 0.0, not a fraction below zero."""
    start = start_epoch(result)
    return None if start is None else max(0.0, start - now)


def _group(pattern: re.Pattern[str], line: str) -> str | None:
    match = pattern.search(line)
    return match.group(1) if match is not None else None


def _error(lines: list[str], *, failed: bool) -> str | None:
    for line in lines:
        match = _ALLOCATION_FAILURE.search(line)
        if match is not None:
            return match.group(1).strip()
    errors = [m.group(1).strip() for m in map(_SBATCH_ERROR.search, lines) if m is not None]
    if errors:
        return errors[-1]
    return lines[-1] if failed and lines else None
