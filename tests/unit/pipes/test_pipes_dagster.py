"""End to end through Dagster: an asset opens a Pipes session, runs a payload process and
reads its files with the real agent program (run locally) or with direct local reads.

No ``from __future__ import annotations`` here: Dagster inspects the asset's context annotation.
"""

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckSpec,
    AssetExecutionContext,
    DagsterInstance,
    ExecuteInProcessResult,
    MetadataValue,
    PipesSession,
    asset,
    materialize,
    open_pipes_session,
)
from pipes_support import PYTHON, FlakySource, write_payload

from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.reader import PipesTailMessageReader
from dagster_slurm.pipes.sources import AgentFileSource, FileSource

During = Callable[[PipesSession, "Job"], None]


@dataclass
class Job:
    """One payload run: its files, and what the reader delivered."""

    directory: Path
    source: FileSource
    stdout_lines: list[str] = field(default_factory=list)
    stderr_lines: list[str] = field(default_factory=list)
    custom_messages: list[Any] = field(default_factory=list)
    reader: PipesTailMessageReader | None = None
    returncode: int | None = None
    notes: dict[str, float] = field(default_factory=dict)
    instance: DagsterInstance = field(default_factory=DagsterInstance.ephemeral)
    run_id: str = ""

    @property
    def context_path(self) -> Path:
        return self.directory / "run" / "context.json"

    def path(self, name: str) -> str:
        return str(self.directory / name)

    def write_context(self, injector: PipesDeferredFileContextInjector) -> None:
        """Write the context file as the job runner does: in its submission round trip."""
        if isinstance(self.source, AgentFileSource):
            self.source.client.run(injector.write_op(makedirs=True))
        else:
            self.context_path.parent.mkdir(parents=True, exist_ok=True)
            self.context_path.write_bytes(injector.payload)


@pytest.fixture
def job(tmp_path: Path, source: FileSource) -> Job:
    return Job(tmp_path, source)


def run_asset(
    job: Job,
    extras: dict[str, Any],
    *,
    checks: bool = False,
    during: During | None = None,
    **reader_options: Any,
) -> ExecuteInProcessResult:
    """Materialize one asset whose body runs the payload with a Pipes session."""
    script = write_payload(job.directory)
    check_specs = [AssetCheckSpec("positive", asset="payload")] if checks else None

    @asset(name="payload", check_specs=check_specs)
    def payload_asset(context: AssetExecutionContext) -> Iterator[Any]:
        injector = PipesDeferredFileContextInjector(str(job.context_path))
        reader = PipesTailMessageReader(
            job.source,
            job.path("messages.jsonl"),
            job.path("stdout.txt"),
            job.path("stderr.txt"),
            stdout_sink=job.stdout_lines.append,
            stderr_sink=job.stderr_lines.append,
            **reader_options,
        )
        job.reader = reader
        with open_pipes_session(context, injector, reader, extras=extras) as session:
            env = {**os.environ, **session.get_bootstrap_env_vars()}
            job.write_context(injector)
            with (
                open(job.path("stdout.txt"), "wb") as out,
                open(job.path("stderr.txt"), "wb") as err,
            ):
                proc = subprocess.Popen([PYTHON, str(script)], env=env, stdout=out, stderr=err)
            reader.wake()  # as a job runner does when it sees the job running
            try:
                if during is not None:
                    during(session, job)
                job.returncode = proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
        job.custom_messages = list(session.get_custom_messages())
        yield from session.get_results()

    result = materialize([payload_asset], instance=job.instance)
    job.run_id = result.run_id
    return result


def user_messages(job: Job, prefix: str = "") -> list[str]:
    """The log messages of the job's Dagster run that start with ``prefix``, in order."""
    entries = job.instance.all_logs(job.run_id)
    return [e.user_message for e in entries if e.user_message.startswith(prefix)]


def test_results_logs_custom_messages_extras_and_stdio_reach_dagster(job: Job) -> None:
    extras = {"mode": "basic", "date": "2024-05-01"}
    result = run_asset(job, extras, checks=True)
    assert result.success and job.returncode == 0
    (materialization,) = result.get_asset_materialization_events()
    metadata = materialization.materialization.metadata
    assert metadata["rows"] == MetadataValue.int(42)
    assert metadata["path"] == MetadataValue.path("/data/x")
    assert materialization.materialization.tags["dagster/data_version"] == "v7"
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.check_name == "positive"
    assert evaluation.metadata["min"] == MetadataValue.int(1)
    assert job.custom_messages == [{"extras": extras, "asset": "payload"}]
    assert "hello from the payload" in user_messages(job)
    assert "a warning from the payload" in user_messages(job)
    assert job.stdout_lines == ["out line 1", "out line 2"]
    assert job.stderr_lines == ["err line 1"]
    assert job.reader is not None and job.reader.received_closed


#: Enough messages for the messages file to take many chunks (about 220 KB in chunks of
#: 16 KiB), and for every third read to fail several times; the throughput with 20,000
#: messages is measured by benchmarks/bench_compute.py.
BULK_LOGS = 2000


def test_many_messages_arrive_in_order_exactly_once_despite_failed_polls(job: Job) -> None:
    lose_answer = isinstance(job.source, AgentFileSource)
    job.source = flaky = FlakySource(job.source, every=3, lose_answer=lose_answer)
    extras = {"mode": "bulk", "logs": BULK_LOGS, "custom_every": 20, "stdout_lines": 1000}
    result = run_asset(job, extras, max_bytes_per_file=16 * 1024, poll_interval=0.05)
    assert result.success and job.returncode == 0
    assert user_messages(job, "log ") == [f"log {i}" for i in range(BULK_LOGS)]
    assert job.custom_messages == [{"seq": k, "after_log": 20 * k + 19} for k in range(100)]
    assert job.stdout_lines == [f"stdout {i}" for i in range(1000)]
    assert job.reader is not None
    assert job.reader.stats.polls >= 10  # the messages file took many chunks
    assert flaky.failures >= 3 and job.reader.stats.failed_polls == flaky.failures
    assert job.reader.stats.messages == BULK_LOGS + 100 + 2  # with "opened" and "closed"


def test_a_message_is_delivered_while_the_payload_runs_within_a_second(job: Job) -> None:
    release = job.directory / "release"

    def measure(session: PipesSession, job: Job) -> None:
        deadline = time.monotonic() + 10
        while not session.get_custom_messages() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen = time.time()
        release.touch()
        (message,) = session.get_custom_messages()
        job.notes["lag"] = seen - message["written_at"]

    result = run_asset(job, {"mode": "lag", "release": str(release)}, during=measure)
    assert result.success and job.returncode == 0
    assert 0 <= job.notes["lag"] < 2.0  # typically poll_interval + one round trip
    assert "released" in user_messages(job)


def test_final_drain_reads_what_was_written_after_the_last_poll(job: Job) -> None:
    start = job.directory / "start"

    def start_after_first_poll(session: PipesSession, job: Job) -> None:
        assert job.reader is not None
        deadline = time.monotonic() + 10
        while job.reader.stats.polls < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        job.notes["polls_before"] = job.reader.stats.polls
        start.touch()

    extras = {"mode": "burst_at_exit", "start": str(start), "logs": 500}
    result = run_asset(job, extras, during=start_after_first_poll, poll_interval=30.0)
    assert result.success and job.returncode == 0
    assert job.notes["polls_before"] == 1
    assert user_messages(job, "late ") == [f"late {i}" for i in range(500)]
    assert job.stdout_lines == ["last stdout words without newline"]
    assert job.reader is not None and job.reader.received_closed
