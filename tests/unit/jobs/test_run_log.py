"""Connection warnings (reconnects, retried polls, replaced agents) reach the step's Dagster
log while the step runs, not only stderr; and only the log of the step they happened in."""

from __future__ import annotations

import contextvars
import logging
import socket
import threading
from pathlib import Path

import dagster as dg

from dagster_slurm.errors import TransportError
from dagster_slurm.jobs.run_log import step_log_relay
from dagster_slurm.jobs.runner import JobRequest, PipesJobRunner, PreparedJob
from dagster_slurm.launchers import BashLauncher
from dagster_slurm.transport.ssh import SSHOptions, SSHTarget, SSHTransport

DEADLINE = 10.0


class Lines:
    """A step log that keeps what it is given, by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def error(self, message: str) -> None:
        self.lines.append(("error", message))


def test_warnings_of_the_connection_loggers_reach_the_step_log_during_the_step() -> None:
    step = Lines()
    logging.getLogger("dagster_slurm.ssh").warning("before the step")
    with step_log_relay(step):
        logging.getLogger("dagster_slurm.ssh").warning("SSH connection to %s was lost; "
                                                       "reconnecting", "me@login:22")
        logging.getLogger("dagster_slurm.scheduler").error("scheduler poll failed")
        logging.getLogger("dagster_slurm.ssh").info("an info line stays in Python logging")
        logging.getLogger("dagster_slurm.jobs").warning("not a connection logger")
    logging.getLogger("dagster_slurm.agent").warning("after the step")
    assert step.lines == [
        ("warning", "SSH connection to me@login:22 was lost; reconnecting"),
        ("error", "scheduler poll failed"),
    ]


def test_threads_in_the_steps_context_are_relayed_and_other_steps_are_not() -> None:
    first, second = Lines(), Lines()
    outside: list[str] = []
    both_in = threading.Barrier(2, timeout=DEADLINE)

    def step(log: Lines, name: str) -> None:
        with step_log_relay(log):
            both_in.wait()
            logging.getLogger("dagster_slurm.pipes").warning(f"{name}: read retried")
            worker = threading.Thread(target=contextvars.copy_context().run, args=(
                logging.getLogger("dagster_slurm.agent").warning, f"{name}: in its reader"))
            stranger = threading.Thread(target=lambda: outside.append(name) or logging.getLogger(
                "dagster_slurm.ssh").warning(f"{name}: a thread of no step"))
            for thread in (worker, stranger):
                thread.start()
                thread.join(DEADLINE)

    threads = [threading.Thread(target=step, args=(log, name))
               for log, name in ((first, "one"), (second, "two"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert sorted(outside) == ["one", "two"]
    assert first.lines == [("warning", "one: read retried"), ("warning", "one: in its reader")]
    assert second.lines == [("warning", "two: read retried"), ("warning", "two: in its reader")]


def test_login_retries_of_the_ssh_transport_reach_the_step_log(tmp_path: Path) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    target = SSHTarget("127.0.0.1", port, "alice", password="pw", host_key_checking="accept-new",
                       known_hosts_path=str(tmp_path / "known_hosts"))
    transport = SSHTransport(target, SSHOptions(connect_timeout=1, reconnect_attempts=2),
                             sleep=lambda seconds: None)
    step = Lines()
    with step_log_relay(step):
        try:
            transport.run(["true"], timeout=5)
        except TransportError:
            pass
    ((level, message),) = step.lines
    assert level == "warning"
    assert message.startswith(f"SSH login to alice@127.0.0.1:{port} (password) failed: ")
    assert message.endswith("(attempt 1/2); retrying in 1.0 s")


class _WarnsWhileWaiting(PipesJobRunner):
    """A runner whose wait meets a failed scheduler poll (logged the way the watcher does)."""

    def _prepare(self, context, request):
        return PreparedJob(context, request, dg.PipesTempFileContextInjector(),
                           dg.PipesTempFileMessageReader())

    def _start(self, job, pipes):
        return "4711"

    def _wait(self, job, handle):
        logging.getLogger("dagster_slurm.scheduler").warning(
            "scheduler poll failed (connection to me@login:22 failed); retrying")
        raise RuntimeError("gave up")

    def _terminate(self, job, handle, error):
        pass

    def _outcome(self, job, handle, result, pipes):
        raise AssertionError("not reached")


def test_the_runner_relays_connection_warnings_to_the_runs_dagster_log() -> None:
    @dg.asset
    def waits(context):
        yield from _WarnsWhileWaiting().run(context, JobRequest("job.sh", BashLauncher())).get_results()

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([waits], instance=instance, raise_on_error=False)
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert "scheduler poll failed (connection to me@login:22 failed); retrying" in messages
