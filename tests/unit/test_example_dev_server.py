"""The example's documented UI command, ``dagster dev -m dagster_slurm_example -d examples``:
the extra that ``scripts/example.sh`` installs brings ``dagster-webserver``; started on
127.0.0.1 with a free port and a fresh ``DAGSTER_HOME``, it serves Dagster's UI page and
loads the example's code location with its assets; Ctrl-C stops every process it started.

No cluster is needed (local mode). ``dagster dev`` is started in a session of its own, so
every process it starts (webserver, daemon, code servers) is found by its session id.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 180.0  # a bound meaning "it came up" (about 15 s here); not a duration check
STOP_TIMEOUT = 60.0

LOCATION_QUERY = """{ workspaceOrError { __typename ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename
      ... on RepositoryLocation { repositories { assetNodes { assetKey { path } } } }
      ... on PythonError { message } } } } } }"""


def _wait_for(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    """The first truthy value of ``predicate()`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.25)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _session_members(sid: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _get(url: str, body: bytes | None = None) -> tuple[int, str] | None:
    """(status, text) of a GET (or a JSON POST of ``body``); None while nothing answers."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers),
                                    timeout=10) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _loaded_location(base: str, log: Path, proc: subprocess.Popen) -> dict | None:
    """The example's code location once loaded; None while it loads."""
    if proc.poll() is not None:
        raise AssertionError(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    answer = _get(f"{base}/graphql", json.dumps({"query": LOCATION_QUERY}).encode())
    if answer is None or answer[0] != 200:
        return None
    workspace = json.loads(answer[1])["data"]["workspaceOrError"]
    entries = workspace.get("locationEntries") or []
    if not entries or entries[0]["loadStatus"] != "LOADED":
        return None
    return entries[0]


def test_the_extra_the_example_installs_brings_the_webserver():
    tomllib = pytest.importorskip("tomllib")
    example = (ROOT / "scripts" / "example.sh").read_text()
    assert "bash scripts/bootstrap.sh" in example
    default = re.search(r"EXTRAS=\$\{DAGSTER_SLURM_EXTRAS:-([a-z,]+)\}",
                        (ROOT / "scripts" / "bootstrap.sh").read_text())
    assert default is not None
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = [req for extra in default.group(1).split(",") for req in extras[extra]]
    assert any(re.match(r"dagster-webserver\b", req) for req in installed), installed


@pytest.mark.slow  # 15-20 s on two cores: three Python processes start and load Dagster
def test_dagster_dev_serves_the_example(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_SLURM_MODE": "local",
           "DAGSTER_SLURM_LOCAL_BASE": str(tmp_path / "runs"),
           "PYTHONPATH": str(ROOT / "src")}
    log = tmp_path / "dagster-dev.log"
    command = [sys.executable, "-m", "dagster", "dev", "-m", "dagster_slurm_example",
               "-d", "examples", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        # A session of its own; SIGINT at its default (dagster dev ignores Ctrl-C when it
        # starts with SIGINT ignored, as a background job of a shell would).
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        status, page = _wait_for("the UI page answering", lambda: _get(base + "/"), START_TIMEOUT)
        assert status == 200
        assert "<title" in page and "Dagster" in page
        entry = _wait_for("the example's code location loaded",
                          lambda: _loaded_location(base, log, proc), START_TIMEOUT)
        location = entry["locationOrLoadError"]
        assert location["__typename"] == "RepositoryLocation", location
        assert entry["name"] == "dagster_slurm_example"
        keys = {node["assetKey"]["path"][-1] for node in location["repositories"][0]["assetNodes"]}
        assert {"shell_report", "squares"} <= keys
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a user stops it
        proc.wait(STOP_TIMEOUT)
        _wait_for("every process of dagster dev gone", lambda: not _session_members(proc.pid),
                  STOP_TIMEOUT)
    finally:
        leftovers = _session_members(proc.pid)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not leftovers
