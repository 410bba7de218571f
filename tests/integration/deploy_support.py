"""A real Dagster deployment for the tests: ``dagster dev`` (webserver, daemon, code server)
on 127.0.0.1, driven over its GraphQL API, with every process it starts accounted for.

:class:`Deployment` starts ``dagster dev`` in a new session (``setsid``): every process it
starts (webserver, daemon, code server, run workers, step processes) carries that session
id, which is how :meth:`Deployment.stop` finds them all without looking at names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg

T = TypeVar("T")

DEFINITIONS = Path(__file__).parent / "deploy_project" / "definitions.py"

#: Run monitoring polls every 2 s; a run stuck in STARTING or CANCELING is failed or
#: cancelled after a minute. Telemetry off: the machine has no network.
DAGSTER_YAML = """
run_monitoring:
  enabled: true
  poll_interval_seconds: 2
  start_timeout_seconds: 180
  cancel_timeout_seconds: 60
telemetry:
  enabled: false
"""

_STARTED_PROCESS = re.compile(r"Started process for run \(pid: (\d+)\)")


def wait_for(what: str, predicate: Callable[[], T], timeout: float,
             interval: float = 0.25) -> T:
    """The first truthy value of ``predicate()`` within ``timeout`` seconds; AssertionError
    naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {value!r})")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, session id) of process ``pid``; None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[3])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == sid and stat[0] != "Z":
                members.append(int(entry.name))
    return members


@dataclass
class Deployment:
    """``dagster dev`` serving :data:`DEFINITIONS` with ``DAGSTER_HOME`` = ``home``."""

    home: Path
    env: Mapping[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    location: str = ""
    repository: str = ""
    stop_seconds: float | None = None
    _instance: dg.DagsterInstance | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/graphql"

    @property
    def log_path(self) -> Path:
        return self.home / "dagster-dev.log"

    def start(self, timeout: float = 180.0) -> None:
        """Start ``dagster dev`` and wait until its code location is loaded."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text(textwrap.dedent(DAGSTER_YAML))
        dagster = [sys.executable, "-m", "dagster", "dev", "-f", str(DEFINITIONS),
                   "--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, **self.env, "DAGSTER_HOME": str(self.home)}
        log = self.log_path.open("wb")
        # A new session: every process dagster dev starts is found by its session id. SIGINT
        # back to its default: dagster dev ignores INT and TERM when started with INT ignored.
        self.proc = subprocess.Popen(
            dagster, cwd=self.home, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        log.close()
        try:
            wait_for("dagster dev serving its code location", self._loaded, timeout, 1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ndagster dev's log ends with:\n{self.tail()}") from None

    def _loaded(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"dagster dev exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            data = self.graphql("""{ workspaceOrError { __typename
                ... on Workspace { locationEntries { name loadStatus locationOrLoadError {
                    __typename
                    ... on RepositoryLocation { repositories { name } }
                    ... on PythonError { message } } } } } }""")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
        workspace = data["workspaceOrError"]
        if workspace["__typename"] != "Workspace" or not workspace["locationEntries"]:
            return False
        entry = workspace["locationEntries"][0]
        location = entry["locationOrLoadError"]
        if location is None or entry["loadStatus"] != "LOADED":
            return False
        if location["__typename"] == "PythonError":
            raise AssertionError(f"{DEFINITIONS} failed to load: {location['message']}")
        self.location, self.repository = entry["name"], location["repositories"][0]["name"]
        return True

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 60.0) -> list[int]:
        """Stop dagster dev as Ctrl-C would, then SIGKILL whatever of its session is left.
        Returns the pids that had to be killed; records the time taken in ``stop_seconds``."""
        if self._instance is not None:
            self._instance.dispose()
            self._instance = None
        if self.proc is None:
            return []
        started = time.monotonic()
        sid = self.proc.pid
        if self.proc.poll() is None:
            os.killpg(sid, signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # its children finish their own shutdown a little after it
        try:
            wait_for("dagster dev's processes gone", lambda: not session_members(sid), 15)
        except AssertionError:
            pass
        leftovers = session_members(sid)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        wait_for("every process of the dagster dev session gone",
                 lambda: not session_members(sid), 30)
        self.stop_seconds = time.monotonic() - started
        return leftovers

    # GraphQL --------------------------------------------------------------------------

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.load(response)
        if payload.get("errors"):
            raise AssertionError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def launch(self, job: str) -> str:
        """Launch ``job`` through ``launchRun``; its run id."""
        data = self.graphql("""
            mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
                __typename
                ... on LaunchRunSuccess { run { runId } }
                ... on PythonError { message stack }
                ... on RunConfigValidationInvalid { errors { message } }
            } }""", {"params": {"selector": {
                "repositoryLocationName": self.location, "repositoryName": self.repository,
                "jobName": job}, "runConfigData": {}}})
        result = data["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def status(self, run_id: str) -> str:
        data = self.graphql("""query($id: ID!) { runOrError(runId: $id) {
            __typename ... on Run { status } ... on PythonError { message } } }""",
                            {"id": run_id})
        run = data["runOrError"]
        assert run["__typename"] == "Run", run
        return run["status"]

    def wait_status(self, run_id: str, wanted: set[str], timeout: float) -> str:
        return wait_for(f"run {run_id} in {sorted(wanted)}",
                        lambda: (s := self.status(run_id)) in wanted and s, timeout, 0.5)

    def terminate(self, run_id: str) -> None:
        data = self.graphql("""mutation($id: String!) { terminateRun(runId: $id) {
            __typename ... on TerminateRunFailure { message } ... on PythonError { message }
            } }""", {"id": run_id})
        assert data["terminateRun"]["__typename"] == "TerminateRunSuccess", data

    def start_sensor(self, name: str) -> str:
        """Start sensor ``name``; the id that :meth:`stop_sensor` takes."""
        data = self.graphql("""mutation($selector: SensorSelector!) {
            startSensor(sensorSelector: $selector) { __typename
              ... on Sensor { sensorState { id status } } ... on PythonError { message } } }""",
                            {"selector": {"repositoryLocationName": self.location,
                                          "repositoryName": self.repository,
                                          "sensorName": name}})
        sensor = data["startSensor"]
        assert sensor["__typename"] == "Sensor", sensor
        assert sensor["sensorState"]["status"] == "RUNNING", sensor
        return sensor["sensorState"]["id"]

    def stop_sensor(self, state_id: str) -> None:
        data = self.graphql("""mutation($id: String!) { stopSensor(id: $id) { __typename
            ... on StopSensorMutationResult { instigationState { status } }
            ... on PythonError { message } } }""", {"id": state_id})
        result = data["stopSensor"]
        assert result["__typename"] == "StopSensorMutationResult", result
        assert result["instigationState"]["status"] == "STOPPED", result

    # The run's events, read from the deployment's instance ----------------------------

    def instance(self) -> dg.DagsterInstance:
        """The deployment's instance (its storage), opened once in this process."""
        if self._instance is None:
            self._instance = dg.DagsterInstance.from_config(str(self.home))
        return self._instance


def messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [entry.message or "" for entry in instance.all_logs(run_id)]


def run_worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid in the run's "Started process for run (pid: N)." event (None before it)."""
    for message in messages(instance, run_id):
        found = _STARTED_PROCESS.search(message)
        if found:
            return int(found.group(1))
    return None


def step_pids(instance: dg.DagsterInstance, run_id: str) -> list[int]:
    """Pids of the run's step processes (from their STEP_START events)."""
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.STEP_START).records
    return [r.event_log_entry.dagster_event.pid for r in records]


def events_of(instance: dg.DagsterInstance, run_id: str,
              kind: dg.DagsterEventType) -> list[Any]:
    return instance.get_records_for_run(run_id, of_type=kind).records
