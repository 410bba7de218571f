"""A session used from several threads of one process: no lock is held across a queue wait.

One thread waits in ``ensure()`` for a head that stays pending; another thread closes the
session, or elects a head. ``close()`` does not wait behind the first thread: it returns,
cancels the pending head and ends the wait. An election whose head is gone installs its new
head for the process, and the first thread's wait ends too. The fake cluster's clock
advances with every poll; each poll also yields a few real milliseconds, so the threads
interleave.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from session_fakes import FakeCluster

from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.slurm.states import JobState

RUN_ID = "0c9d5e2a-6b1f-4c8e-9a3d-2f7e1b4c6d80"
DEADLINE = 20.0  # real seconds any wait of these tests may take at most


def _slurm() -> SlurmResource:
    return SlurmResource(
        ssh=SSHConnectionResource(host="login.invalid", user="u"),
        remote_base="/cluster/ds",
        queue=SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G"),
    )


def _session(cluster: FakeCluster | None = None) -> tuple[RunSession, FakeCluster]:
    config = SlurmRunAllocationConfig(time_limit="01:00:00")
    probe = RunSession(_slurm(), RUN_ID, config, BashLauncher(), activation=lambda: None)
    cluster = cluster or FakeCluster(probe.initial_document())
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:  # the fake clock is shared by the threads
            cluster.clock.sleep(seconds)
        time.sleep(0.005)

    session = RunSession(_slurm(), RUN_ID, config, BashLauncher(), activation=lambda: None,
                         io=cluster, clock=cluster.clock.monotonic, sleep=sleep,
                         background=False)
    return session, cluster


def _wait_for(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"not within {DEADLINE:g} s: {what}")


class _Waiter(threading.Thread):
    """Calls ``session.ensure()`` in a thread of its own, keeping what it returned or raised."""

    def __init__(self, session: RunSession) -> None:
        super().__init__(daemon=True)
        self.session = session
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.session.ensure()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc


def test_close_from_another_thread_ends_a_wait_for_a_pending_head() -> None:
    session, cluster = _session()
    cluster.on_submit = lambda job: None  # the head stays pending
    waiter = _Waiter(session)
    waiter.start()
    _wait_for(lambda: cluster.calls.get("sbatch") == 1, "the head was submitted")
    closer = threading.Thread(target=session.close, kwargs={"cancel": True}, daemon=True)
    closer.start()
    closer.join(DEADLINE)
    assert not closer.is_alive(), "close() waited behind the pending head"
    waiter.join(DEADLINE)
    assert not waiter.is_alive(), "the wait for the head did not end after close()"
    assert isinstance(waiter.error, SessionError) and "closed" in str(waiter.error)
    assert "100" in cluster.cancelled  # the pending head is cancelled
    assert session.current_allocation() is None
    with pytest.raises(SessionError, match="closed"):
        session.ensure()


def test_an_election_in_another_thread_installs_its_head_while_a_wait_is_in_progress() -> None:
    session, cluster = _session()
    cluster.on_submit = lambda job: None  # every head stays pending until started
    waiter = _Waiter(session)
    waiter.start()
    _wait_for(lambda: cluster.calls.get("sbatch") == 1, "the first head was submitted")
    # the pending head is cancelled; the election submits a new one, which starts
    cluster.on_submit = lambda job: cluster.start(job.job_id, nodes=("c2",))
    cluster.end("100", JobState.CANCELLED)
    elected = session.replace_head(timeout=600)
    assert elected.job_id != "100" and session.current_allocation() is elected
    waiter.join(DEADLINE)
    assert not waiter.is_alive()
    # the first thread's wait ended too: with the elected head, or with the end of its own
    assert waiter.error is None or "100" in str(waiter.error)
    assert waiter.error is not None or waiter.result.job_id == elected.job_id
    session.close(cancel=True)
