"""The heartbeat thread of a run session in one process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

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
