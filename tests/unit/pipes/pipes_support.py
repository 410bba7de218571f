"""Shared code of the Pipes tests: file sources that fail, a recording handler, a payload."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagster_slurm.agent.results import TailChunk, TailRequest
from dagster_slurm.errors import TransportError
from dagster_slurm.pipes.sources import FileSource

PYTHON = sys.executable


class FlakySource:
    """Wraps a source; every ``every``-th call raises :class:`TransportError` without data.

    ``lose_answer`` False: the call fails before reaching the files (connection refused).
    ``lose_answer`` True: the inner source reads the files, then the answer is lost on the way
    back (connection dropped mid-reply); the reader never sees the data either way.
    """

    def __init__(self, inner: FileSource, every: int, *, lose_answer: bool = False) -> None:
        self.inner = inner
        self.every = every
        self.lose_answer = lose_answer
        self.calls = 0
        self.failures = 0

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        self.calls += 1
        failing = self.calls % self.every == 0
        if failing and not self.lose_answer:
            self.failures += 1
            raise TransportError(f"connection refused (call {self.calls})")
        chunks = self.inner.read(requests)
        if failing:
            self.failures += 1
            raise TransportError(f"connection dropped before the answer (call {self.calls})")
        return chunks


class CountingSource:
    """Wraps a source and records every request list it was asked for."""

    def __init__(self, inner: FileSource) -> None:
        self.inner = inner
        self.requests: list[list[TailRequest]] = []

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        self.requests.append(list(requests))
        return self.inner.read(requests)


class RecordingHandler:
    """Stands in for Dagster's ``PipesMessageHandler``: records what it is given."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.framework_exceptions: list[str] = []
        self.fail_on = fail_on

    def handle_message(self, message: dict[str, Any]) -> None:
        if self.fail_on is not None and message.get("method") == self.fail_on:
            raise RuntimeError(f"cannot handle {self.fail_on}")
        self.messages.append(message)

    def report_pipes_framework_exception(self, origin: str, exc_info: Any) -> None:
        self.framework_exceptions.append(origin)

    def logs(self) -> list[str]:
        return [m["params"]["message"] for m in self.messages if m["method"] == "log"]


def log_line(text: str) -> bytes:
    """One line of the messages file as the payload's default writer writes it."""
    message = {"__dagster_pipes_version": "0.1", "method": "log", "params": {"message": text}}
    return (json.dumps(message) + "\n").encode()


PAYLOAD = textwrap.dedent(
    """
    import os
    import sys
    import time

    from dagster_pipes import open_dagster_pipes


    def basic(pipes):
        pipes.log.info("hello from the payload")
        pipes.log.warning("a warning from the payload")
        print("out line 1")
        print("out line 2", flush=True)
        print("err line 1", file=sys.stderr, flush=True)
        pipes.report_asset_materialization(
            metadata={"rows": 42, "path": {"raw_value": "/data/x", "type": "path"}},
            data_version="v7",
        )
        pipes.report_asset_check(check_name="positive", passed=True, metadata={"min": 1})
        pipes.report_custom_message({"extras": pipes.extras, "asset": pipes.asset_key})


    def bulk(pipes):
        logs, every = pipes.get_extra("logs"), pipes.get_extra("custom_every")
        seq = 0
        for i in range(logs):
            pipes.log.info(f"log {i}")
            if i % every == every - 1:
                pipes.report_custom_message({"seq": seq, "after_log": i})
                seq += 1
        for i in range(pipes.get_extra("stdout_lines")):
            print(f"stdout {i}")


    def lag(pipes):
        release = pipes.get_extra("release")
        pipes.report_custom_message({"written_at": time.time()})
        deadline = time.time() + 30
        while not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.01)
        pipes.log.info("released")


    def burst_at_exit(pipes):
        start = pipes.get_extra("start")
        deadline = time.time() + 30
        while not os.path.exists(start) and time.time() < deadline:
            time.sleep(0.01)
        for i in range(pipes.get_extra("logs")):
            pipes.log.info(f"late {i}")
        sys.stdout.write("last stdout words without newline")


    with open_dagster_pipes() as pipes:
        {"basic": basic, "bulk": bulk, "lag": lag, "burst_at_exit": burst_at_exit}[
            pipes.get_extra("mode")
        ](pipes)
    """
)


def write_payload(directory: Path) -> Path:
    path = directory / "payload.py"
    path.write_text(PAYLOAD)
    return path


class FakeClock:
    """A monotonic clock that only moves when ``sleep`` is called."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
