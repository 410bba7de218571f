"""The allocation this process's steps use now, and whether the session was closed here.

:class:`CurrentAllocation` is the only writer of that state: the head path installs the
allocation it attached to or started, an ended allocation is dropped, an election replaces
it, and :meth:`RunSession.close` closes the session for this process. Its lock guards only
these fields, for the time of one assignment: no caller holds it across a queue wait or a
round trip to the cluster, so ``close()`` and an election in another thread never wait
behind a head that is still pending.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from dagster_slurm.session.core.errors import SessionError

if TYPE_CHECKING:
    from dagster_slurm.session.core.allocation import SlurmAllocation


class CurrentAllocation:
    """This process's current allocation of one run session (None until a step needs one),
    with the session's ``closed`` and ``used`` flags of this process."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name
        self._lock = threading.Lock()
        self._allocation: SlurmAllocation | None = None
        self._closed = False
        self._used = False

    def current(self) -> SlurmAllocation | None:
        """The allocation steps use now; None when there is none yet (or it was dropped)."""
        with self._lock:
            return self._allocation

    def install(self, allocation: SlurmAllocation) -> SlurmAllocation:
        """Make ``allocation`` the current one and return it. Raises :class:`SessionError`
        once the session was closed in this process (a head that became ready after
        ``close()`` is not handed out)."""
        with self._lock:
            self.check_open()
            self._allocation = allocation
            return allocation

    def drop(self, allocation: SlurmAllocation | None = None, *,
             unless_job: str | None = None) -> None:
        """Forget the current allocation: only when it is ``allocation`` (given), and not
        when its job id is ``unless_job`` (given); with neither, whatever it is."""
        with self._lock:
            cached = self._allocation
            if cached is None or (allocation is not None and cached is not allocation):
                return
            if unless_job is not None and cached.job_id == unless_job:
                return
            self._allocation = None

    def begin_use(self) -> None:
        """Mark the session used by this process; raises :class:`SessionError` once it
        was closed here."""
        with self._lock:
            self.check_open()
            self._used = True

    def check_open(self) -> None:
        """Raise :class:`SessionError` when the session was closed in this process."""
        if self._closed:
            raise SessionError(f"the run session {self.job_name} was closed in this process")

    def close(self) -> None:
        """Mark the session closed in this process: nothing is installed any more."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran in this process."""
        return self._closed

    @property
    def used(self) -> bool:
        """True once this process used the session (a step, a submission, a hook)."""
        return self._used
