"""The background threads of a run session in one process: the heartbeat, and the head
watch of a session with a Ray launcher (made by the front, which knows the feature)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dagster_slurm.session")


class Heartbeat(threading.Thread):
    """Calls ``beat()`` every ``interval`` seconds until stopped (a daemon thread); a
    failed beat is logged and retried at the next interval."""

    def __init__(self, job_name: str, beat: Callable[[], None], interval: float) -> None:
        super().__init__(name=f"dagster-slurm-heartbeat-{job_name}", daemon=True)
        self.job_name = job_name
        self.beat = beat
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried next interval
                log.warning("heartbeat of %s failed: %s", self.job_name, exc)

    def stop(self) -> None:
        """End the thread (waits up to 10 s for a beat in flight)."""
        self._stop_event.set()
        self.join(timeout=10)


class SessionThreads:
    """The threads a session runs while a process uses it, started once and stopped by
    ``close()``: the first beat at :meth:`start`, then (with ``background``) a
    :class:`Heartbeat` and the thread ``watch()`` returns (None: none). Without
    ``background`` nothing runs in the background: beats happen when called."""

    def __init__(self, job_name: str, beat: Callable[[], None], interval: float, *,
                 background: bool, watch: Callable[[], Any] | None) -> None:
        self.job_name = job_name
        self.beat = beat
        self.interval = interval
        self.background = background
        self.watch = watch
        self._lock = threading.Lock()
        self._started = False
        self._running: list[Any] = []

    def start(self) -> None:
        """The first beat and the threads; nothing once started (or stopped)."""
        with self._lock:
            if self._started:
                return
            self.beat()
            self._started = True
            if not self.background:
                return
            threads = [Heartbeat(self.job_name, self.beat, self.interval)]
            if self.watch is not None:
                threads.append(self.watch())
            for thread in threads:
                thread.start()
            self._running = threads

    def stop(self) -> None:
        """Stop the threads (no thread is started after this)."""
        with self._lock:
            self._started = True
            running, self._running = self._running, []
        for thread in running:
            thread.stop()
