"""Accounting read until final (jobs/final_accounting.py) and the metadata chosen from it.

The loop runs on a fake clock whose ``sleep`` only advances time; the sacct round trips
run through the real agent program over LocalTransport, with a scripted ``sacct`` on PATH.
Behaviour against a real slurmdbd that lags is covered by
tests/integration/test_lagging_accounting.py.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.results import ExecResult
from dagster_slurm.backoff import PollBackoff
from dagster_slurm.jobs.final_accounting import (
    ACCOUNTING_DEADLINE,
    AccountingAnswer,
    job_accounting,
    lag_warning,
    observed_metrics,
    read_until_final,
)
from dagster_slurm.jobs.metrics import METADATA_KEYS, from_local, from_sacct, from_step
from dagster_slurm.scheduler.client import JobObservation, SlurmScheduler
from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.parsers import parse_squeue
from dagster_slurm.slurm.states import JobState
from dagster_slurm.transport.local import LocalTransport

PENDING = "7|dsl-x|PENDING|0:0|00:00:00|0||00:00:00|1|None assigned|1|Unknown|Unknown"
RUNNING = "7|dsl-x|RUNNING|0:0|00:00:02|2||00:00:00|1|c1|1|2026-12-01T10:00:00|Unknown"
COMPLETED = "\n".join([
    "7|dsl-x|COMPLETED|0:0|00:00:04|4||00:00:02|1|c1|1|2026-12-01T10:00:00|2026-12-01T10:00:04",
    "7.batch|batch|COMPLETED|0:0|00:00:04|4|51200K|00:00:02|1|c1|1|2026-12-01T10:00:00|"
    "2026-12-01T10:00:04",
])
SQUEUE_DONE = "7|dsl-x|COMPLETED|None|0:00|10:00|2026-12-01T10:00:00|2026-12-01T10:00:04|c1|1|" \
              "(null)|cpu|1|500M|0:04|dslurm-abc"


class Clock:
    """Monotonic time that only ``sleep`` advances; records every sleep."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, seconds
        self.sleeps.append(seconds)
        self.t += seconds


def record(text: str):
    return parse_sacct(text)["7"]


def answers(*items):
    """A ``read`` returning ``items`` in order (an exception item is raised)."""
    queue = list(items)
    calls: list[float] = []

    def read():
        calls.append(0)
        item = queue.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    read.calls = calls
    return read


# -- the loop ----------------------------------------------------------------------------

def test_a_final_first_answer_costs_no_further_read_and_no_wait() -> None:
    clock = Clock()
    read = answers()
    got = read_until_final(read, lambda v: v == "final", first="final", clock=clock,
                           sleep=clock.sleep)
    assert (got.value, got.final, got.attempts, got.waited) == ("final", True, 1, 0.0)
    assert read.calls == [] and clock.sleeps == []


def test_reads_again_through_the_backoff_until_the_answer_is_final() -> None:
    clock = Clock()
    read = answers("PENDING", "RUNNING", "COMPLETED")
    got = read_until_final(read, lambda v: v == "COMPLETED", first="failed",
                           backoff=PollBackoff(initial=0.5, maximum=3.0, factor=1.5),
                           clock=clock, sleep=clock.sleep)
    assert got.final and got.value == "COMPLETED" and got.attempts == 4
    assert clock.sleeps == [0.5, 0.75, 1.125]
    assert got.waited == pytest.approx(2.375)


def test_never_final_stops_at_the_deadline_with_a_last_read_there() -> None:
    clock = Clock()
    reads: list[float] = []

    def read():
        reads.append(clock.t)
        return "PENDING"

    got = read_until_final(read, lambda v: v == "COMPLETED", first="PENDING", deadline=10.0,
                           clock=clock, sleep=clock.sleep)
    assert not got.final and got.value == "PENDING"
    assert sum(clock.sleeps) == pytest.approx(10.0) and max(clock.sleeps) <= 3.0
    assert reads[-1] == pytest.approx(10.0)  # no wait ends after the deadline
    assert got.attempts == len(reads) + 1 and got.waited == pytest.approx(10.0)


def test_the_default_deadline_is_bounded_and_reads_a_handful_of_times() -> None:
    clock = Clock()
    got = read_until_final(lambda: None, lambda v: False, first="x", clock=clock,
                           sleep=clock.sleep)
    assert got.waited == pytest.approx(ACCOUNTING_DEADLINE)
    assert 10 <= ACCOUNTING_DEADLINE <= 15 and 4 <= got.attempts <= 12


def test_without_a_first_answer_the_first_read_is_immediate() -> None:
    clock = Clock()
    got = read_until_final(answers("COMPLETED"), lambda v: v == "COMPLETED", clock=clock,
                           sleep=clock.sleep)
    assert got.final and got.attempts == 1 and clock.sleeps == []


def test_a_read_that_raises_ends_the_reads_and_is_returned_not_raised() -> None:
    clock = Clock()
    broken = ConnectionError("link down")
    got = read_until_final(answers("RUNNING", broken), lambda v: v == "COMPLETED",
                           first="PENDING", clock=clock, sleep=clock.sleep)
    assert got.error is broken and not got.final and got.value == "RUNNING"
    assert got.attempts == 2
    first_fails = read_until_final(answers(broken), lambda v: True, clock=clock, sleep=clock.sleep)
    assert first_fails.value is None and first_fails.error is broken and first_fails.attempts == 0


def test_deadline_zero_keeps_the_single_answer() -> None:
    clock = Clock()
    read = answers()
    got = read_until_final(read, lambda v: False, first="PENDING", deadline=0.0, clock=clock,
                           sleep=clock.sleep)
    assert got.attempts == 1 and not got.final and read.calls == []


# -- which figures are reported ----------------------------------------------------------

def test_lagging_pending_accounting_never_becomes_the_state_of_a_job_that_ended() -> None:
    metrics = from_sacct("7", record(PENDING), 0, "COMPLETED", source="squeue", nodes="c1")
    meta = metrics.as_metadata()
    assert meta["dagster_slurm/state"] == "COMPLETED"
    assert meta["dagster_slurm/state_source"] == "squeue"
    assert meta["dagster_slurm/exit_code"] == 0 and meta["dagster_slurm/nodes"] == "c1"
    for key in ("elapsed_seconds", "cpu_efficiency", "max_rss_mb"):
        assert meta[f"dagster_slurm/{key}"] is None, key


def test_final_accounting_gives_state_and_figures() -> None:
    meta = from_sacct("7", record(COMPLETED), None, "COMPLETED", source="squeue").as_metadata()
    assert meta["dagster_slurm/state"] == "COMPLETED"
    assert meta["dagster_slurm/state_source"] == "sacct"
    assert meta["dagster_slurm/elapsed_seconds"] == 4.0 and meta["dagster_slurm/exit_code"] == 0
    assert meta["dagster_slurm/max_rss_mb"] == 50.0 and meta["dagster_slurm/nodes"] == "c1"


def test_no_state_at_all_is_null_with_a_null_source() -> None:
    for observed in (None, "RUNNING", "PENDING", "garbage"):
        meta = from_sacct("7", record(RUNNING), None, observed, source="squeue").as_metadata()
        assert meta["dagster_slurm/state"] is None, observed
        assert meta["dagster_slurm/state_source"] is None
        assert meta["dagster_slurm/exit_code"] is None  # a running record's code is not used


def test_the_reported_state_is_always_final_or_null() -> None:
    for accounted in JobState:
        line = PENDING.replace("PENDING", accounted.value)
        for observed in [*JobState, None]:
            state = observed.value if observed is not None else None
            meta = from_sacct("7", record(line), 0, state, source="squeue").as_metadata()
            reported = meta["dagster_slurm/state"]
            assert reported is None or JobState(reported).terminal, (accounted, observed)
            assert (meta["dagster_slurm/state_source"] is None) == (reported is None)
            if meta["dagster_slurm/state_source"] != "sacct":
                assert meta["dagster_slurm/elapsed_seconds"] is None


def test_every_constructor_gives_every_key() -> None:
    for metrics in (
        from_sacct("7", None, 0, "COMPLETED", source="squeue"),
        from_sacct("7", record(COMPLETED), 0, "COMPLETED"),
        from_step("7", None, "0", 0, "c1"),
        from_local("local-1", 0, 1.0, 0.5, 10),
    ):
        assert tuple(metrics.as_metadata()) == METADATA_KEYS
    assert from_local("local-1", 0, 1.0, 0.5, 10).as_metadata()["dagster_slurm/state_source"] \
        == "process"


def test_a_step_line_still_running_gives_the_status_file_state_and_no_figures() -> None:
    running = parse_sacct(RUNNING + "\n7.0|step|RUNNING|0:0|00:00:02|2||00:00:00|1|c1|1|"
                          "2026-12-01T10:00:00|Unknown")["7"].steps[0]
    meta = from_step("7", running, "0", 0, "c1").as_metadata()
    assert meta["dagster_slurm/state"] == "COMPLETED"
    assert meta["dagster_slurm/state_source"] == "status_file"
    assert meta["dagster_slurm/job_id"] == "7.0" and meta["dagster_slurm/elapsed_seconds"] is None
    failed = from_step("7", running, "0", 3, "c1").as_metadata()
    assert failed["dagster_slurm/state"] == "FAILED"
    unknown = from_step("7", running, "0", None, "c1").as_metadata()
    assert unknown["dagster_slurm/state"] is None and unknown["dagster_slurm/state_source"] is None
    done = parse_sacct(COMPLETED.replace("7.batch|batch", "7.0|step"))["7"].steps[0]
    final = from_step("7", done, "0", 0, "c1").as_metadata()
    assert final["dagster_slurm/state_source"] == "sacct"
    assert final["dagster_slurm/elapsed_seconds"] == 4.0


def _observation(source: str, accounting=None) -> JobObservation:
    queue = parse_squeue(SQUEUE_DONE)[0] if source == "squeue" else None
    return JobObservation("7", JobState.COMPLETED, exit_code=0, source=source, queue=queue,
                          accounting=accounting)


def test_observed_metrics_fall_back_on_the_observation_and_say_so() -> None:
    clock = Clock()
    read = read_until_final(lambda: AccountingAnswer(record(PENDING)), lambda a: a.final,
                            first=AccountingAnswer(None, "Connection refused"), deadline=3.0,
                            clock=clock, sleep=clock.sleep)
    metrics = observed_metrics(_observation("squeue"), read)
    meta = metrics.as_metadata()
    assert (meta["dagster_slurm/state"], meta["dagster_slurm/state_source"]) == ("COMPLETED", "squeue")
    assert meta["dagster_slurm/nodes"] == "c1" and meta["dagster_slurm/elapsed_seconds"] is None
    warning = lag_warning("7", read, metrics)
    assert warning is not None
    assert "job 7" in warning and "sacct said PENDING" in warning and "squeue" in warning
    assert "over 3.0 s" in warning


def test_an_observation_read_from_final_accounting_keeps_its_figures() -> None:
    clock = Clock()
    read = read_until_final(lambda: AccountingAnswer(None, "boom"), lambda a: a.final,
                            first=AccountingAnswer(None, "boom"), deadline=1.0, clock=clock,
                            sleep=clock.sleep)
    metrics = observed_metrics(_observation("sacct", accounting=record(COMPLETED)), read)
    assert metrics.state_source == "sacct" and metrics.elapsed_seconds == 4.0
    assert lag_warning("7", read, metrics) is None


def test_answer_descriptions_name_what_sacct_said() -> None:
    assert AccountingAnswer(None, "Connection refused").describe() == \
        "sacct failed: Connection refused"
    assert AccountingAnswer(None).describe() == "sacct had no record of the job"
    assert AccountingAnswer(record(RUNNING)).describe() == "sacct said RUNNING"
    assert AccountingAnswer(record(COMPLETED)).final and not AccountingAnswer(record(PENDING)).final


# -- one round trip per read, through the real agent ---------------------------------------

@pytest.fixture
def scripted_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A ``sacct`` on PATH that answers with the scripted outputs in turn (``None``: fail)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sacct"
    state = tmp_path / "sacct-answers"

    def set_answers(*outputs: str | None) -> None:
        state.mkdir()
        for index, output in enumerate(outputs):
            (state / f"{index:03d}").write_text("FAIL" if output is None else output + "\n")

    script.write_text(f"""#!/bin/sh
next=$(ls {state} | head -n 1)
[ -n "$next" ] || {{ echo "sacct: no answer scripted" >&2; exit 2; }}
file={state}/$next
if [ "$(cat "$file")" = FAIL ]; then
  rm -f "$file"
  echo "sacct: error: Problem talking to the database: Connection refused" >&2
  exit 1
fi
cat "$file"; rm -f "$file"
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    return set_answers


def test_job_accounting_reads_once_per_round_trip_until_final(tmp_path, scripted_sacct) -> None:
    transport = LocalTransport(default_timeout=60)
    scheduler = SlurmScheduler(AgentClient(transport, str(tmp_path / "base"), python=sys.executable))
    scripted_sacct(None, PENDING, COMPLETED)
    first = scheduler.agent.run(scheduler.accounting_op(["7"]))  # the caller's first answer
    assert first.rc == 1
    clock = Clock()
    before = transport.stats.round_trips
    got = job_accounting(scheduler, "7", first, clock=clock, sleep=clock.sleep)
    assert got.final and got.value.record.state is JobState.COMPLETED
    assert got.attempts == 3 and transport.stats.round_trips - before == 2
    assert len(clock.sleeps) == 2


def test_a_failing_sacct_is_not_final_and_its_message_is_kept(tmp_path, scripted_sacct) -> None:
    transport = LocalTransport(default_timeout=60)
    scheduler = SlurmScheduler(AgentClient(transport, str(tmp_path / "base"), python=sys.executable))
    scripted_sacct(*([None] * 20))
    clock = Clock()
    got = job_accounting(scheduler, "7", ExecResult(1, "", "x\nsacct: error: down\n"), deadline=2.0,
                         clock=clock, sleep=clock.sleep)
    assert not got.final and got.value.error.endswith("Connection refused")
    assert got.waited == pytest.approx(2.0)


# -- run scope -----------------------------------------------------------------------------

def _step_of_allocation_7(tmp_path):
    """A scheduler on the local agent, and step 0 of allocation 7 as ``step_metrics`` sees
    them: its recorded step id file and the allocation."""
    from dagster_slurm.session.frontend.runner import STEP_ID_FILE

    transport = LocalTransport(default_timeout=60)
    scheduler = SlurmScheduler(AgentClient(transport, str(tmp_path / "base"), python=sys.executable))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / STEP_ID_FILE).write_text("0\n")
    paths = SimpleNamespace(file=lambda name: str(job_dir / name))
    allocation = SimpleNamespace(scheduler=scheduler, job_id="7", head="c1")
    return scheduler, paths, allocation


def test_step_metrics_wait_for_the_step_line_and_never_report_running(
    tmp_path, scripted_sacct, caplog
) -> None:
    from dagster_slurm.session.frontend.runner import step_metrics

    scheduler, paths, allocation = _step_of_allocation_7(tmp_path)
    step_running = RUNNING + "\n7.0|step|RUNNING|0:0|00:00:02|2||00:00:00|1|c1|1|" \
                             "2026-12-01T10:00:00|Unknown"
    step_done = RUNNING + "\n7.0|step|COMPLETED|0:0|00:00:03|3|10240K|00:00:01|1|c1|1|" \
                          "2026-12-01T10:00:00|2026-12-01T10:00:03"

    scripted_sacct(None, step_running, step_done)
    clock = Clock()
    meta = step_metrics(allocation, paths, 0, clock=clock, sleep=clock.sleep).as_metadata()
    assert (meta["dagster_slurm/state"], meta["dagster_slurm/state_source"]) == ("COMPLETED", "sacct")
    assert meta["dagster_slurm/job_id"] == "7.0" and meta["dagster_slurm/elapsed_seconds"] == 3.0

    (tmp_path / "sacct-answers").rmdir()
    scripted_sacct(*([step_running] * 20))
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="dagster_slurm.session"):
        meta = step_metrics(allocation, paths, 0, deadline=4.0, clock=clock,
                             sleep=clock.sleep).as_metadata()
    assert (meta["dagster_slurm/state"], meta["dagster_slurm/state_source"]) == \
        ("COMPLETED", "status_file")
    assert meta["dagster_slurm/elapsed_seconds"] is None and clock.t == pytest.approx(4.0)
    assert "showed no final state" in caplog.text
    assert "sacct said RUNNING for the step" in caplog.text


# -- accounting that is away ---------------------------------------------------------------

def test_accounting_away_since_before_the_job_is_read_once_without_waiting(
    tmp_path, scripted_sacct
) -> None:
    transport = LocalTransport(default_timeout=60)
    scheduler = SlurmScheduler(AgentClient(transport, str(tmp_path / "base"), python=sys.executable))
    scripted_sacct(*([None] * 5))
    started = scheduler.now()
    first = scheduler.agent.run(scheduler.accounting_op(["7"]))
    clock = Clock()
    got = job_accounting(scheduler, "7", first, deadline=15.0, started=started,
                         clock=clock, sleep=clock.sleep)
    assert not got.final and got.attempts == 1 and clock.sleeps == []


def test_accounting_that_answered_during_the_job_is_read_again_when_it_fails_at_the_end(
    tmp_path, scripted_sacct
) -> None:
    transport = LocalTransport(default_timeout=60)
    scheduler = SlurmScheduler(AgentClient(transport, str(tmp_path / "base"), python=sys.executable))
    scripted_sacct(RUNNING, None, COMPLETED)
    started = scheduler.now()
    scheduler.accounting_records(scheduler.agent.run(scheduler.accounting_op(["7"])))  # answered
    first = scheduler.agent.run(scheduler.accounting_op(["7"]))  # slurmdbd restarting
    clock = Clock()
    got = job_accounting(scheduler, "7", first, deadline=15.0, started=started,
                         clock=clock, sleep=clock.sleep)
    assert got.final and got.attempts == 2


def test_a_status_poll_carries_one_accounting_probe_a_minute(tmp_path, scripted_sacct) -> None:
    transport = LocalTransport(default_timeout=60)
    now = [1000.0]
    scheduler = SlurmScheduler(AgentClient(transport, str(tmp_path / "base"), python=sys.executable),
                               clock=lambda: now[0])
    scripted_sacct(None, "")  # the poll's probe fails, the next one answers
    squeue = tmp_path / "bin" / "squeue"
    squeue.write_text("#!/bin/sh\nexit 0\n")
    squeue.chmod(0o755)
    scheduler.status(["dsl-x"], [], accounting=False)
    assert scheduler.stats.by_command.get("sacct_probe") is None  # no accounting asked for
    before = transport.stats.round_trips
    scheduler.status(["dsl-x"], [])
    assert scheduler.stats.by_command["sacct_probe"] == 1
    assert transport.stats.round_trips - before == 1, "the probe rides in the poll's round trip"
    assert scheduler.accounting_outlook.view().failed_at == 1000.0
    scheduler.status(["dsl-x"], [])
    assert scheduler.stats.by_command["sacct_probe"] == 1, "not again within the minute"
    now[0] += 60.0
    scheduler.status(["dsl-x"], [])
    assert scheduler.stats.by_command["sacct_probe"] == 2
    assert scheduler.accounting_outlook.view().answered_at == 1060.0


def test_a_run_scope_step_does_not_wait_for_accounting_away_and_the_run_is_told_once(
    tmp_path, scripted_sacct, caplog
) -> None:
    from dagster_slurm.session.frontend.runner import step_metrics

    scheduler, paths, allocation = _step_of_allocation_7(tmp_path)
    scripted_sacct(*([None] * 5))
    started = scheduler.now()
    told: list[str] = []
    for _ in range(2):
        clock = Clock()
        meta = step_metrics(allocation, paths, 0, clock=clock, sleep=clock.sleep, warn=told.append,
                            started=started, run_id="run-a").as_metadata()
        assert (meta["dagster_slurm/state"], meta["dagster_slurm/state_source"]) == \
            ("COMPLETED", "status_file")
        assert clock.sleeps == []
    assert len(told) == 1 and "once per run" in told[0] and "sacct failed" in told[0]
