"""What a partitioned run records of its tasks: messages, outcomes, metadata, failures.

Shared by the job-array runner (slurm mode) and the process pool (local mode): they feed
:class:`ArrayProgress` the bytes of each task's Pipes messages file as they read them and
a :class:`TaskEnd` when a task has ended; it does the rest.

* A task's Pipes ``log`` messages reach the step's log prefixed with its key
  (``[key] message``); materializations, asset checks and custom messages it reports are
  read with Dagster's own :class:`~dagster.PipesMessageHandler` (one per task).
* When a task ends well, its partition gets its metadata at once: what the payload
  reported with its materialization plus the task's figures (job id ``<array>_<index>``,
  state, exit code, elapsed, ...), through ``add_asset_metadata(..., partition_key=key)``.
  Figures read later (accounting, at the end of the array) are added to it then.
* Dagster records a step's materializations when the step returns: one per partition of
  the run, each with its partition's metadata (:meth:`ArrayProgress.results`). When some
  task failed the step fails (:class:`SlurmArrayTasksFailed`, naming each failed key with
  its exit code and the tail of its log) and only the partitions whose tasks succeeded are
  recorded as materialized, by an explicit ``AssetMaterialization`` each
  (:meth:`ArrayProgress.raise_failures`); a backfill of the failed partitions then runs only
  those. (An event logged per task as it ends would be recorded a second time by Dagster
  when the step returns.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    MaterializeResult,
    OpExecutionContext,
    PipesMessageHandler,
)

from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.array_files import PartitionTask
from dagster_slurm.pipes.tailing import TailedFile

__all__ = ["ArrayInvocation", "ArrayProgress", "SlurmArrayTasksFailed", "TaskEnd", "TaskFailure"]

#: Lines of a failed task's stdout and stderr quoted in the step's error.
TAIL_LINES = 20
#: Failed partitions whose exit code and output tails the step's error quotes (every failed
#: key is named; the details of each are also in the step's log as its task ends).
DETAILED_FAILURES = 10


@dataclass(frozen=True)
class TaskEnd:
    """How one task ended: ``job_id`` (``<array>_<index>`` in slurm mode, ``local-<pid>``
    locally), ``state`` (a final state name: COMPLETED, FAILED, CANCELLED, TIMEOUT, ...),
    ``exit_code`` (None when the payload wrote none), ``figures`` (the task's metadata
    figures, ``dagster_slurm/*`` keys; empty when none were observed)."""

    job_id: str
    state: str
    exit_code: int | None
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        """The task completed and its payload exited 0."""
        return self.state == "COMPLETED" and self.exit_code in (0, None)


@dataclass(frozen=True)
class TaskFailure:
    """A task that did not succeed: its partition ``key``, how it ended, the last lines of
    its output, and the exception its payload reported through Pipes (None: none)."""

    key: str
    end: TaskEnd
    stdout_tail: str = ""
    stderr_tail: str = ""
    pipes_error: str | None = None

    def describe(self) -> str:
        code = f", exit code {self.end.exit_code}" if self.end.exit_code is not None else ""
        parts = [f"partition {self.key!r} (job {self.end.job_id}, {self.end.state}{code})"]
        if self.pipes_error:
            parts.append(f"  the payload reported: {self.pipes_error}")
        for name, tail in (("stderr", self.stderr_tail), ("stdout", self.stdout_tail)):
            if tail.strip():
                lines = tail.rstrip().splitlines()[-TAIL_LINES:]
                parts.append(f"  {name} (last lines):\n" + "\n".join("    " + ln for ln in lines))
        return "\n".join(parts)


class SlurmArrayTasksFailed(DagsterSlurmError):
    """Some partitions of a multi-partition run failed. ``failures`` names each (key, job
    id, state, exit code, output tails); ``succeeded`` holds the keys that were recorded
    as materialized."""

    def __init__(self, failures: Sequence[TaskFailure], succeeded: Sequence[str], total: int) -> None:
        self.failures = tuple(failures)
        self.succeeded = tuple(succeeded)
        keys = ", ".join(repr(f.key) for f in self.failures)
        head = (f"{len(self.failures)} of {total} partitions failed: {keys}. The "
                f"{len(self.succeeded)} that succeeded are materialized; a backfill of the "
                "failed partitions runs only those.")
        details = [f.describe() for f in self.failures[:DETAILED_FAILURES]]
        if len(self.failures) > DETAILED_FAILURES:
            details.append(f"... and {len(self.failures) - DETAILED_FAILURES} more failed "
                           "partitions (each is in the step's log)")
        super().__init__("\n".join([head, *details]))


class _OneWriter:
    """The message reader :class:`~dagster.PipesMessageHandler` asks about its writers."""

    expected_writer_count = 1

    def on_opened(self, opened_payload: Any) -> None:
        del opened_payload

    def on_launched(self, launched_payload: Any) -> None:
        del launched_payload


class _TaskMessages:
    """The Pipes messages of one task, read as they arrive."""

    def __init__(self, context: OpExecutionContext, task: PartitionTask) -> None:
        self.task = task
        self.context = context
        self.handler = PipesMessageHandler(context, _OneWriter())  # type: ignore[arg-type]
        self.file = TailedFile("messages", task.messages, max_line_bytes=16 * 2**20)
        self.error: str | None = None
        self.checks_seen = False

    def feed(self, data: bytes, *, final: bool = False) -> None:
        lines = self.file.feed(data)
        if final:
            rest = self.file.take_pending()
            if rest is not None:
                lines.append(rest)
        for line in lines:
            if line.strip():
                self._handle(line)

    def _handle(self, line: bytes) -> None:
        try:
            message = json.loads(line)
            method = message["method"]
        except (ValueError, KeyError, TypeError):
            self.context.log.warning(f"[{self.task.key}] unreadable Pipes message: {line[:200]!r}")
            return
        params = message.get("params") or {}
        if method == "opened":
            return
        if method == "log":
            level = str(params.get("level", "info")).lower()
            self.context.log.log(level, f"[{self.task.key}] {params.get('message', '')}")
            return
        if method == "closed":
            exception = params.get("exception") if isinstance(params, dict) else None
            if isinstance(exception, dict):
                name, text = exception.get("name") or "error", exception.get("message") or ""
                self.error = text if str(text).startswith(str(name)) else f"{name}: {text}"
            return
        if method == "report_asset_check":
            self.checks_seen = True
        try:
            self.handler.handle_message(message)
        except Exception as exc:  # noqa: BLE001 - one bad message does not stop the run
            self.context.log.warning(f"[{self.task.key}] Pipes message not understood: {exc}")

    def reported(self) -> list[MaterializeResult]:
        return [r for r in self.handler.get_reported_results() if isinstance(r, MaterializeResult)]


class ArrayProgress:
    """The tasks of one multi-partition run (see the module docstring).

    ``tasks``: one per key, in the run's order; ``summary``: figures of the whole run added
    to the step's results (set by the runner before :meth:`results`)."""

    def __init__(self, context: OpExecutionContext, tasks: Sequence[PartitionTask]) -> None:
        self.context = context
        self.tasks = list(tasks)
        self._messages = {t.position: _TaskMessages(context, t) for t in self.tasks}
        self.ends: dict[int, TaskEnd] = {}
        self.failures: dict[int, TaskFailure] = {}
        #: position -> asset key -> the partition's metadata so far (succeeded tasks only)
        self._metadata: dict[int, dict[AssetKey, dict[str, Any]]] = {}
        self.summary: dict[str, Any] = {}
        self._asset_context = AssetExecutionContext(context) if context.has_assets_def else None
        self._asset_keys: list[AssetKey] = (sorted(context.selected_asset_keys, key=str)
                                            if context.has_assets_def else [])

    # -- feeding --------------------------------------------------------------------------
    def messages_of(self, position: int) -> TailedFile:
        """The read position in ``position``'s messages file (the caller reads from
        ``offset`` and passes what it got to :meth:`feed`)."""
        return self._messages[position].file

    def feed(self, position: int, data: bytes, *, final: bool = False) -> None:
        """New bytes of the task's messages file; ``final``: the task has ended and this is
        the rest of its file (an unterminated last line is read too)."""
        self._messages[position].feed(data, final=final)

    @property
    def open_positions(self) -> list[int]:
        """Positions of the tasks that have not ended yet."""
        return [t.position for t in self.tasks if t.position not in self.ends]

    def finish(self, position: int, end: TaskEnd, *, stdout_tail: str = "",
               stderr_tail: str = "") -> None:
        """Record how the task at ``position`` ended; a success gives its partition its
        metadata at once, a failure is logged and kept for the step's error."""
        task = self.tasks[position]
        messages = self._messages[position]
        self.ends[position] = end
        if messages.checks_seen:
            self.context.log.warning(
                f"[{task.key}] asset check results reported by a partition's task are not "
                "recorded (a check of a multi-partition run covers the run, not a partition)")
        if not end.succeeded:
            failure = TaskFailure(task.key, end, stdout_tail, stderr_tail, messages.error)
            self.failures[position] = failure
            self.context.log.error(f"Task of {failure.describe()}")
            return
        reported = {r.asset_key: dict(r.metadata or {}) for r in messages.reported()}
        keys = self._asset_keys or [k for k in reported if k is not None]
        for asset_key in keys:
            metadata = {**reported.get(asset_key, reported.get(None, {})), **end.figures}
            self._metadata.setdefault(position, {})[asset_key] = metadata
            self._add_metadata(asset_key, task.key, metadata)
        self.context.log.info(f"[{task.key}] task {end.job_id} completed")

    def add_figures(self, position: int, figures: Mapping[str, Any]) -> None:
        """Figures learnt after the task ended (final accounting) for its partition."""
        end = self.ends.get(position)
        if end is None:
            return
        self.ends[position] = TaskEnd(end.job_id, end.state, end.exit_code,
                                      {**end.figures, **figures})
        if position in self.failures:
            failure = self.failures[position]
            self.failures[position] = TaskFailure(failure.key, self.ends[position],
                                                  failure.stdout_tail, failure.stderr_tail,
                                                  failure.pipes_error)
            return
        for asset_key, metadata in self._metadata.get(position, {}).items():
            metadata.update(figures)
            self._add_metadata(asset_key, self.tasks[position].key, metadata)

    def _add_metadata(self, asset_key: AssetKey, key: str, metadata: Mapping[str, Any]) -> None:
        if self._asset_context is None:
            return
        clean = {name: value for name, value in metadata.items() if value is not None}
        self._asset_context.add_asset_metadata(clean, asset_key=asset_key, partition_key=key)

    def retry(self, positions: Sequence[int]) -> None:
        """The tasks at ``positions`` run again: their ends, failures and messages read so
        far are forgotten."""
        for position in positions:
            self.ends.pop(position, None)
            self.failures.pop(position, None)
            self._messages[position] = _TaskMessages(self.context, self.tasks[position])
            self._metadata.pop(position, None)

    # -- the end --------------------------------------------------------------------------
    def raise_failures(self) -> None:
        """With failed tasks: record the succeeded partitions as materialized (an event
        each) and raise :class:`SlurmArrayTasksFailed`; without, nothing."""
        if not self.failures:
            return
        succeeded = [t for t in self.tasks if t.position in self.ends
                     and t.position not in self.failures]
        for task in succeeded:
            for asset_key in self._asset_keys:
                metadata = self._metadata.get(task.position, {}).get(asset_key, {})
                self.context.log_event(AssetMaterialization(
                    asset_key=asset_key, partition=task.key,
                    metadata={k: v for k, v in metadata.items() if v is not None}))
        failures = [self.failures[p] for p in sorted(self.failures)]
        raise SlurmArrayTasksFailed(failures, [t.key for t in succeeded], len(self.tasks))

    def results(self) -> list[MaterializeResult]:
        """The step's results when every task succeeded: one per asset of the step, with
        :attr:`summary` (each partition's own metadata was added as its task ended)."""
        summary = {k: v for k, v in self.summary.items() if v is not None}
        if not self._asset_keys:
            return []
        return [MaterializeResult(asset_key=key, metadata=summary) for key in self._asset_keys]


@dataclass(frozen=True)
class ArrayInvocation:
    """What ``compute.run`` returns for a multi-partition run: ``get_results()`` as the
    Pipes invocation of a single run (``yield from compute.run(...).get_results()``)."""

    results: tuple[MaterializeResult, ...]
    metadata: Mapping[str, Any]

    def get_results(self) -> Sequence[MaterializeResult]:
        """One :class:`~dagster.MaterializeResult` per asset of the step (none for an op)."""
        return self.results

    def get_materialize_result(self) -> MaterializeResult:
        """The one result of a single-asset step."""
        if len(self.results) != 1:
            raise DagsterSlurmError(
                f"the step has {len(self.results)} asset results; use get_results()")
        return self.results[0]

    def get_custom_messages(self) -> Sequence[Any]:
        """Custom messages are per partition; none are returned for the run."""
        return ()
