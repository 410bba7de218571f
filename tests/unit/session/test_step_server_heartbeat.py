"""The step server's dead-man's switch and its Ray head watcher (the step server template run
with bash and the stub Slurm commands of ``step_server_stubs``)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from step_server_stubs import JOB_ID, PACE, Server, read, step_server, wait_for

from dagster_slurm.session.core.paths import SessionPaths

#: The heartbeat limit of the dead-man's switch tests, in whole seconds; the server's clock
#: counts whole seconds and it checks every second, so a switch that wrongly fired would fire
#: within LIMIT + 2 s of the server's start.
LIMIT = 2
#: How long those tests watch a server that must stay up: that bound and a 1.5 s margin.
ALIVE_FOR = LIMIT + 3.5


# -- dead-man's switch -------------------------------------------------------------------------


def test_stale_heartbeat_cancels_the_allocation(tmp_path: Path) -> None:
    def old_heartbeat(paths: SessionPaths) -> None:
        Path(paths.heartbeat).write_text("login 1\n")
        subprocess.run(["touch", "-d", "-60 seconds", paths.heartbeat], check=True)

    with step_server(tmp_path, heartbeat_timeout=LIMIT, before_start=old_heartbeat) as server:
        server.wait_ready()
        scancel = server.logs / "scancel.args"
        wait_for(scancel.exists, timeout=15, what=f"scancel\n{server.log()}")
        assert scancel.read_text() == f"{JOB_ID}\n"
        assert read(server.job_dir / "ended_by") == "heartbeat\n"
        assert "no supervisor heartbeat" in server.log()


@contextmanager
def beating(server: Server, beat: Callable[[int], None]) -> Iterator[list[float]]:
    """Call ``beat(n)`` every 0.25 s (n = 1, 2, ...) while the block runs; yields a list
    that holds the monotonic time at which the last beat started."""
    stop = threading.Event()
    last = [time.monotonic()]

    def loop() -> None:
        n = 0
        while not stop.wait(0.25):
            n += 1
            last[0] = time.monotonic()
            beat(n)

    beater = threading.Thread(target=loop, daemon=True)
    beater.start()
    try:
        yield last
    finally:
        stop.set()
        beater.join(timeout=5)


def _write_beat(path: str, n: int, *, mtime_offset: float | None = None) -> None:
    """What a supervisor's beat does: new content, written atomically; optionally the file's
    mtime moved by ``mtime_offset`` seconds (a shared filesystem's cached or skewed mtime)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(f"login 1 {n}\n")
    tmp.replace(path)
    if mtime_offset is not None:
        when = time.time() + mtime_offset
        os.utime(path, (when, when))


def _assert_alive_for(server: Server, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert not (server.logs / "scancel.args").exists(), server.log()
        assert server.proc.poll() is None, server.log()
        time.sleep(0.2)


def _first_heartbeat(paths: SessionPaths) -> None:
    Path(paths.heartbeat).write_text("login 1 0\n")


def test_fresh_heartbeat_keeps_the_allocation(tmp_path: Path) -> None:
    with step_server(tmp_path, heartbeat_timeout=LIMIT, before_start=_first_heartbeat) as server:
        with beating(server, lambda n: _write_beat(server.paths.heartbeat, n)):
            server.wait_ready()
            _assert_alive_for(server, ALIVE_FOR)


@pytest.mark.parametrize("mtime_offset", [-3600.0, 3600.0])
def test_changing_content_keeps_the_allocation_whatever_the_mtime(
    tmp_path: Path, mtime_offset: float
) -> None:
    # an mtime an hour old (attribute cache) or an hour ahead (clock skew) is not looked at
    with step_server(tmp_path, heartbeat_timeout=LIMIT, before_start=_first_heartbeat) as server:
        beat = lambda n: _write_beat(server.paths.heartbeat, n, mtime_offset=mtime_offset)  # noqa: E731
        with beating(server, beat):
            server.wait_ready()
            _assert_alive_for(server, ALIVE_FOR)


@pytest.mark.parametrize("mtime_offset", [0.0, 3600.0])
def test_unchanged_content_ends_the_allocation_though_the_file_is_touched(
    tmp_path: Path, mtime_offset: float
) -> None:
    def touch(_n: int) -> None:
        when = time.time() + mtime_offset
        os.utime(server.paths.heartbeat, (when, when))

    with step_server(tmp_path, heartbeat_timeout=LIMIT, before_start=_first_heartbeat) as server:
        with beating(server, touch):
            server.wait_ready()
            scancel = server.logs / "scancel.args"
            wait_for(scancel.exists, timeout=15, what=f"scancel\n{server.log()}")
    assert scancel.read_text() == f"{JOB_ID}\n"
    assert read(server.job_dir / "ended_by") == "heartbeat\n"
    assert "content has not changed" in server.log()


def test_heartbeat_that_stops_changing_ends_the_allocation(tmp_path: Path) -> None:
    with step_server(tmp_path, heartbeat_timeout=LIMIT, before_start=_first_heartbeat) as server:
        with beating(server, lambda n: _write_beat(server.paths.heartbeat, n)) as last:
            server.wait_ready()
            _assert_alive_for(server, LIMIT + 1)
        scancel = server.logs / "scancel.args"
        wait_for(scancel.exists, timeout=15, what=f"scancel\n{server.log()}")
    assert time.monotonic() - last[0] >= LIMIT  # the limit counts from the last change
    assert read(server.job_dir / "ended_by") == "heartbeat\n"


# -- the Ray head's watcher --------------------------------------------------------------------


def test_a_ray_head_that_stops_answering_is_recorded_once(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with step_server(tmp_path, ray_address=f"127.0.0.1:{port}") as server:
        server.wait_ready()
        marker = server.job_dir / "ray_stopped"
        wait_for(marker.exists, timeout=60, what=f"the ray_stopped marker\n{server.log()}")
        assert marker.read_text().strip().isdigit()
        probe_every = PACE["__DS_SS_PROBE_EVERY"]
        assert f"does not answer (3 probes, {probe_every} s apart)" in server.log()
        assert server.proc.poll() is None  # the server goes on; the session decides
