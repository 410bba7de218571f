"""The job script's dead-man's switch (asset scope): it judges the heartbeat file's content.

The scripts run with bash on this machine; ``scancel`` is a stand-in on ``PATH`` that records
its arguments and then does what Slurm does to a cancelled batch job: TERM to the script.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_support import RUN_TIMEOUT, JobFiles, start_script, wait_for_file

from dagster_slurm.errors import ConfigurationError

FAKE_SCANCEL = """\
#!/bin/sh
echo "$@" >> "$DS_TEST_SCANCELLED"
# the watchdog runs scancel; its parent is the job script
kill -TERM "$(awk '{print $4}' /proc/$PPID/stat)"
"""


@pytest.fixture
def slurm_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scancel"
    fake.write_text(FAKE_SCANCEL)
    fake.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "SLURM_JOB_ID": "4242",
        "DS_TEST_SCANCELLED": str(tmp_path / "scancelled"),
        "DS_TEST_MARK": uuid.uuid4().hex,  # every process of the script inherits it
    }


def _processes_with(mark: str) -> list[int]:
    """Pids of live processes whose environment carries ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"DS_TEST_MARK={mark}".encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _until(predicate, timeout: float = RUN_TIMEOUT) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


class _Beater:
    """Writes new heartbeat content every 0.3 s, each time setting the mtime an hour back
    (what a shared filesystem's attribute cache could show)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        n = 0
        while not self.stop.wait(0.3):
            n += 1
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(f"beat {n}\n")
            os.replace(tmp, self.path)
            old = time.time() - 3600
            os.utime(self.path, (old, old))

    def __enter__(self) -> _Beater:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def mark_cleanup(slurm_env: dict[str, str]) -> Iterator[None]:
    yield
    for pid in _processes_with(slurm_env["DS_TEST_MARK"]):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _beat_number(path: Path) -> int:
    words = path.read_text().split()
    return int(words[-1]) if words and words[-1].isdigit() else 0


def _plan(job: JobFiles, payload: tuple[str, ...], limit: float = 2.0):  # noqa: ANN202
    return job.plan(payload, mode="slurm", heartbeat_file=str(job.job_dir / "heartbeat"),
                    heartbeat_timeout=limit)


def test_unchanged_heartbeat_content_cancels_the_job_and_says_why(
    job: JobFiles, slurm_env: dict[str, str], mark_cleanup: None
) -> None:
    heartbeat = job.job_dir / "heartbeat"
    heartbeat.write_text("submitted\n")
    script = job.write(_plan(job, ("sleep", "60")))
    process = start_script(script, env=slurm_env)
    try:
        # The file is touched all the time, its content never changes: the mtime is ignored.
        stop = threading.Event()

        def touch() -> None:
            while not stop.wait(0.2):
                os.utime(heartbeat)

        threading.Thread(target=touch, daemon=True).start()
        _, stderr = process.communicate(timeout=RUN_TIMEOUT)
        stop.set()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert Path(slurm_env["DS_TEST_SCANCELLED"]).read_text().split() == ["4242"]
    assert (job.job_dir / "ended_by").read_text().strip() == "heartbeat"
    assert "no heartbeat from the waiting step" in stderr and "limit 2 s" in stderr
    assert "cancelling job 4242" in stderr
    assert process.returncode == 143 and job.status() == 143
    assert _until(lambda: not _processes_with(slurm_env["DS_TEST_MARK"]), 5)


def test_changing_content_with_an_old_mtime_keeps_the_job(
    job: JobFiles, slurm_env: dict[str, str], mark_cleanup: None
) -> None:
    heartbeat = job.job_dir / "heartbeat"
    heartbeat.write_text("submitted\n")
    release = job.job_dir / "release"
    # The payload ends when the test says so: after more than three limits of beating.
    payload = ("bash", "-c", f'until [ -e "{release}" ]; do sleep 0.1; done')
    script = job.write(_plan(job, payload))
    with _Beater(heartbeat):
        process = start_script(script, env=slurm_env)
        try:
            beats_seen = _until(lambda: _beat_number(heartbeat) >= 25, 30)
            release.touch()
            _, stderr = process.communicate(timeout=RUN_TIMEOUT)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert beats_seen
    assert process.returncode == 0 and job.status() == 0, stderr
    assert not (job.job_dir / "ended_by").exists()
    assert not Path(slurm_env["DS_TEST_SCANCELLED"]).exists()
    assert "no heartbeat" not in stderr


def test_the_watchdog_ends_with_the_script(
    job: JobFiles, slurm_env: dict[str, str], mark_cleanup: None
) -> None:
    script = job.write(_plan(job, ("true",), limit=600))
    process = start_script(script, env=slurm_env)
    process.communicate(timeout=RUN_TIMEOUT)
    assert process.returncode == 0 and job.status() == 0
    # Stopped by the script on its way out (its own check of the script would take 2 s).
    assert _until(lambda: not _processes_with(slurm_env["DS_TEST_MARK"]), 1.5)
    assert not (job.job_dir / "ended_by").exists()


def test_no_limit_no_watchdog(job: JobFiles, slurm_env: dict[str, str]) -> None:
    script = job.write(job.plan(("bash", "-c", "sleep 0.5"), mode="slurm"))
    assert "__ds_heartbeat_timeout=''" in script.read_text()
    process = start_script(script, env=slurm_env)
    try:
        wait_for_file(job.pid_file)
        # the script and the payload only (no watchdog, no watchdog sleep)
        assert len(_processes_with(slurm_env["DS_TEST_MARK"])) <= 3
    finally:
        process.communicate(timeout=RUN_TIMEOUT)
    assert process.returncode == 0


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"mode": "local", "heartbeat_file": "/j/heartbeat", "heartbeat_timeout": 600},
         "slurm mode only"),
        ({"mode": "slurm", "heartbeat_timeout": 600}, "give both or neither"),
        ({"mode": "slurm", "heartbeat_file": "/j/heartbeat"}, "give both or neither"),
        ({"mode": "slurm", "heartbeat_file": "/j/heartbeat", "heartbeat_timeout": 0},
         "positive number"),
    ],
)
def test_plan_refuses_an_incomplete_or_local_heartbeat(
    job: JobFiles, overrides: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigurationError, match="heartbeat_timeout") as info:
        job.plan(("true",), **overrides)
    assert words in str(info.value)
