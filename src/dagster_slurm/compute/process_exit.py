"""Waiting for a child process to exit without polling it.

:class:`ExitWatch` wakes its caller the moment the child exits: on Linux (5.3 and later) it
waits on a pidfd (``os.pidfd_open``), which becomes readable when the process ends, so the
wait costs no wake-ups and adds no latency. Elsewhere (or when the kernel refuses a pidfd)
it falls back to sleeping through a short :class:`~dagster_slurm.backoff.PollBackoff`, as
the caller would poll ``waitpid`` itself.

The watch never reaps the child: the caller still collects the exit status (``os.wait4``),
so the pid stays the child's until then and cannot be reused under the watch.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from types import TracebackType

from dagster_slurm.backoff import PollBackoff

__all__ = ["ExitWatch"]


class ExitWatch:
    """Waits until the child process ``pid`` exits, or a timeout passes.

    ``poll_initial`` and ``poll_maximum``: first and longest pause of the polling fallback
    (seconds); ``sleep``: how the fallback pauses (replaceable in tests). Use it as a context
    manager (or call :meth:`close`) so the pidfd is closed.
    """

    def __init__(self, pid: int, *, poll_initial: float = 0.02, poll_maximum: float = 0.1,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.pid = pid
        self._sleep = sleep
        self._backoff = PollBackoff(initial=poll_initial, maximum=poll_maximum)
        self._fd: int | None = None
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            try:
                self._fd = opener(pid)
            except OSError:  # old kernel, seccomp, the process already reaped
                self._fd = None

    @property
    def event_driven(self) -> bool:
        """True when the watch waits on a pidfd; False when it polls."""
        return self._fd is not None

    def wait(self, timeout: float) -> bool:
        """Block until the process has exited or ``timeout`` seconds have passed.

        Returns True when the process is known to have exited (it is then a zombie waiting
        to be reaped); False when the timeout passed, or, when polling, after one pause
        (the caller checks the process itself). Signals interrupt the wait as they would
        interrupt ``time.sleep``.
        """
        if self._fd is None:
            self._sleep(min(self._backoff.current, max(timeout, 0.0)))
            self._backoff.observe(False)
            return False
        readable, _, _ = select.select([self._fd], [], [], max(timeout, 0.0))
        return bool(readable)

    def close(self) -> None:
        """Release the pidfd (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ExitWatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
