"""Parsers for the output of ``sbatch``, ``squeue`` and ``scontrol``.

Text in, records out; no I/O. Every parser accepts any string and never raises. A field
that cannot be read becomes None (never ``0``, ``False`` or ``""``), so "unknown" stays
distinguishable from a real zero. Times are naive datetimes in the cluster's local time.
``sacct`` output is handled by :mod:`dagster_slurm.slurm.accounting` and ``sbatch --test-only``
output by :mod:`dagster_slurm.slurm.test_only` (both re-exported here).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from dagster_slurm.slurm.accounting import SacctRecord, SacctStep, parse_sacct
from dagster_slurm.slurm.commands import SQUEUE_FIELDS
from dagster_slurm.slurm.hostlist import expand_hostlist
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.test_only import TestOnlyResult, parse_test_only
from dagster_slurm.slurm.units import optional_text, parse_int, parse_size_bytes, parse_timestamp
from dagster_slurm.slurm.walltime import parse_duration

__all__ = [
    "SacctRecord",
    "SacctStep",
    "SqueueRecord",
    "TestOnlyResult",
    "expand_hostlist",
    "min_job_age_seconds",
    "parse_sacct",
    "parse_sbatch_parsable",
    "parse_scontrol_config",
    "parse_squeue",
    "parse_test_only",
]

_PARSABLE = re.compile(r"([0-9]{1,12})(?:;\S+)?")
_NONE = frozenset({"none", "(null)", "n/a"})


def parse_sbatch_parsable(text: object) -> str | None:
    """The job id printed by ``sbatch --parsable`` (``123`` or ``123;cluster``).

    The last line of that shape wins (warnings may precede it). None when there is none.
    """
    if not isinstance(text, str):
        return None
    for line in reversed(text.splitlines()):
        match = _PARSABLE.fullmatch(line.strip())
        if match is not None:
            return match.group(1)
    return None


@dataclass(frozen=True)
class SqueueRecord:
    """One job as listed by :func:`~dagster_slurm.slurm.commands.squeue_argv`.

    Every optional field is None when ``squeue`` printed nothing readable for it.
    """

    job_id: str
    """Job id as printed (``123``, ``123_4`` for an array task)."""
    name: str | None
    """Job name."""
    state: JobState
    """Parsed state; ``UNKNOWN`` when unreadable (see ``raw_state``)."""
    raw_state: str | None
    """State text as printed."""
    reason: str | None
    """Why the job waits (``Resources``, ``Priority``...); None when Slurm says ``None``."""
    time_left_seconds: float | None
    """Remaining walltime (``math.inf`` if unlimited); None when ``INVALID`` (overran)."""
    time_limit_seconds: float | None
    """Current time limit (``math.inf`` if unlimited); follows ``scontrol update``."""
    start_time: datetime | None
    """Actual or expected start; None when ``N/A`` (not yet scheduled)."""
    end_time: datetime | None
    """Actual or expected end; None when ``N/A``."""
    node_list: str | None
    """Allocated nodes in Slurm's compact form (``c[1-2]``); None while pending."""
    nodes: tuple[str, ...] | None
    """``node_list`` expanded; ``()`` while pending, None when unreadable."""
    num_nodes: int | None
    """Allocated (or, while pending, requested minimum) node count."""
    tres_per_node: str | None
    """Requested trackable resources per node as Slurm prints them: ``gres:gpu:2`` on 22.05,
    ``gres/gpu:2`` on 24.11 (see :attr:`gpus_per_node`); None when ``N/A``."""
    partition: str | None
    """Partition the job runs or waits in."""
    cpus: int | None
    """CPUs requested or allocated."""
    min_memory_bytes: int | None
    """Requested memory per node (or per CPU, as Slurm reports it) in bytes."""
    elapsed_seconds: float | None
    """Time used so far."""
    comment: str | None
    """``--comment`` text, None when unset."""
    tres_alloc: str | None = None
    """Trackable resources the scheduler reports for the job (``cpu=2,mem=2000M,node=1,
    gres/gpu=1``): the grant once it runs, the request before. Only listed by
    :func:`~dagster_slurm.slurm.commands.squeue_observe_argv` (None otherwise)."""

    @property
    def gpus_per_node(self) -> int | None:
        """GPUs requested per node, read from :attr:`tres_per_node` in either release's
        spelling (``gres:gpu:2``, ``gres/gpu:2``, typed ``gres/gpu:a100:2``; typed entries
        add up); None when it names no GPU."""
        counts = [int(m.group(1)) for m in _GPU_PER_NODE.finditer(self.tres_per_node or "")]
        return sum(counts) if counts else None


_GPU_PER_NODE = re.compile(r"(?:^|,)(?:gres[:/])?gpu(?::[^:,=]+)?:([0-9]{1,6})(?=,|$)")


_SQUEUE_HEADERS: dict[str, str] = {
    "JOBID": "job_id",
    "NAME": "name",
    "STATE": "state",
    "ST": "state",
    "REASON": "reason",
    "TIME_LEFT": "time_left",
    "TIME_LIMIT": "time_limit",
    "START_TIME": "start_time",
    "END_TIME": "end_time",
    "NODELIST": "node_list",
    "NODES": "num_nodes",
    "TRES_PER_NODE": "tres_per_node",
    "PARTITION": "partition",
    "CPUS": "cpus",
    "MIN_MEMORY": "min_memory",
    "TIME": "elapsed",
    "COMMENT": "comment",
    "TRES_ALLOC": "tres_alloc",
}
_DEFAULT_COLUMNS: tuple[str, ...] = tuple(name for name, _ in SQUEUE_FIELDS)


def parse_squeue(text: object) -> list[SqueueRecord]:
    """Records from ``squeue`` output in :data:`~dagster_slurm.slurm.commands.SQUEUE_FORMAT`.

    Output with a header line (``JOBID|...``, i.e. without ``--noheader``) is read by
    column name instead, so other ``|``-separated layouts work as long as they use the
    standard headers. Lines with too few columns or no job id are skipped.
    """
    if not isinstance(text, str):
        return []
    lines = [line for line in text.splitlines() if line.strip()]
    columns = _DEFAULT_COLUMNS
    if lines and lines[0].split("|", 1)[0].strip().upper() == "JOBID":
        header = lines[0]
        # ``squeue -O 'field:|,...'`` ends every line with the separator: drop that one
        trailing = header.endswith("|")
        columns = tuple(_SQUEUE_HEADERS.get(h.strip().upper(), "")
                        for h in (header[:-1] if trailing else header).split("|"))
        lines = [line[:-1] if trailing and line.endswith("|") else line for line in lines[1:]]
    records = []
    for line in lines:
        cells = line.split("|", len(columns) - 1)
        if len(cells) != len(columns):
            continue
        values: dict[str, str] = {}
        for column, cell in zip(columns, cells, strict=True):
            if column and column not in values:
                values[column] = cell
        record = _squeue_record(values)
        if record is not None:
            records.append(record)
    return records


def _squeue_record(values: Mapping[str, str]) -> SqueueRecord | None:
    job_id = optional_text(values.get("job_id"))
    if job_id is None or any(char.isspace() for char in job_id):
        return None
    node_list = optional_text(values.get("node_list"), none_values=_NONE)
    return SqueueRecord(
        job_id=job_id,
        name=optional_text(values.get("name")),
        state=JobState.parse(values.get("state")),
        raw_state=optional_text(values.get("state")),
        reason=optional_text(values.get("reason"), none_values=_NONE),
        time_left_seconds=parse_duration(values.get("time_left")),
        time_limit_seconds=parse_duration(values.get("time_limit")),
        start_time=parse_timestamp(values.get("start_time")),
        end_time=parse_timestamp(values.get("end_time")),
        node_list=node_list,
        nodes=expand_hostlist(node_list or ""),
        num_nodes=parse_int(values.get("num_nodes")),
        tres_per_node=optional_text(values.get("tres_per_node"), none_values=_NONE),
        partition=optional_text(values.get("partition")),
        cpus=parse_int(values.get("cpus")),
        min_memory_bytes=parse_size_bytes(values.get("min_memory"), default_unit="M"),
        elapsed_seconds=parse_duration(values.get("elapsed")),
        comment=optional_text(values.get("comment"), none_values=frozenset({"(null)"})),
        tres_alloc=optional_text(values.get("tres_alloc"), none_values=_NONE),
    )


_CONFIG_LINE = re.compile(r"\s*([^\s=]+)\s*=\s*(.*?)\s*")


def parse_scontrol_config(text: object) -> dict[str, str]:
    """``Key = value`` pairs of ``scontrol show config`` (values kept as text, e.g. ``300 sec``).

    Lines without ``=`` (the ``Configuration data as of`` header, section titles, the
    ``Slurmctld(primary) at ... is UP`` footer) are skipped; a repeated key keeps its first value.
    """
    if not isinstance(text, str):
        return {}
    config: dict[str, str] = {}
    for line in text.splitlines():
        match = _CONFIG_LINE.fullmatch(line)
        if match is not None:
            config.setdefault(match.group(1), match.group(2))
    return config


_MIN_JOB_AGE = re.compile(r"([0-9]{1,12})(?:\s*sec)?", re.IGNORECASE)


def min_job_age_seconds(config: Mapping[str, str]) -> int | None:
    """``MinJobAge`` in seconds (how long finished jobs stay visible to ``squeue``).

    Reads ``300 sec`` or ``300``; None when the key is missing or unreadable.
    """
    value = config.get("MinJobAge")
    if value is None:
        value = next((v for k, v in config.items() if k.lower() == "minjobage"), None)
    match = _MIN_JOB_AGE.fullmatch(value.strip()) if isinstance(value, str) else None
    return int(match.group(1)) if match is not None else None
