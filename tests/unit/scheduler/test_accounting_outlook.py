"""What the process knows of accounting decides whether a job's end waits for sacct."""

from __future__ import annotations

import pytest

from dagster_slurm.jobs.final_accounting import AccountingAnswer, once_per_run
from dagster_slurm.scheduler.accounting_outlook import (
    PROBE_INTERVAL,
    AccountingOutlook,
    AccountingReach,
    end_read_deadline,
    probe_argv,
    reach_of,
)

#: sacct's own words on Slurm 22.05 (dev cluster, slurmdbd stopped / no accounting storage).
REFUSED = ("sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
           "connection to host:127.0.0.1:16819: Connection refused\n"
           "sacct: error: Sending PersistInit msg: Connection refused\n"
           "sacct: error: Problem talking to the database: Connection refused\n")
DISABLED = "Slurm accounting storage is disabled\n"


@pytest.mark.parametrize(("rc", "stderr", "reach"), [
    (0, "", AccountingReach.ANSWERED),
    (1, REFUSED, AccountingReach.UNREACHABLE),
    (1, DISABLED, AccountingReach.DISABLED),
    (1, "sacct: error: something else\n", AccountingReach.UNREACHABLE),
])
def test_reach_of_a_sacct_call(rc: int, stderr: str, reach: AccountingReach) -> None:
    assert reach_of(rc, stderr) is reach


def test_the_probe_asks_for_no_job() -> None:
    argv = probe_argv()
    assert argv[0] == "sacct" and "--starttime=now" in argv and "--endtime=now" in argv
    assert not any(a.startswith("--jobs") for a in argv)


def test_accounting_that_answered_during_the_job_is_waited_for_when_it_fails_at_its_end() -> None:
    outlook = AccountingOutlook()
    outlook.observe(AccountingReach.ANSWERED, at=105.0)
    view = outlook.view()
    assert end_read_deadline(view, AccountingReach.UNREACHABLE, job_started=100.0, deadline=15) == 15


def test_accounting_away_since_before_the_job_is_not_waited_for() -> None:
    outlook = AccountingOutlook()
    outlook.observe(AccountingReach.ANSWERED, at=50.0)
    outlook.observe(AccountingReach.UNREACHABLE, at=101.0)
    assert end_read_deadline(outlook.view(), AccountingReach.UNREACHABLE, 100.0, 15) == 0.0
    # never heard of at all: the same
    assert end_read_deadline(AccountingOutlook().view(), AccountingReach.UNREACHABLE, 100.0, 15) == 0


def test_disabled_accounting_is_never_waited_for_and_never_probed() -> None:
    outlook = AccountingOutlook()
    outlook.observe(AccountingReach.ANSWERED, at=105.0)
    assert end_read_deadline(outlook.view(), AccountingReach.DISABLED, 100.0, 15) == 0.0
    outlook.observe(AccountingReach.DISABLED, at=106.0)
    assert outlook.view().disabled and not outlook.probe_due(10_000.0)


def test_an_answer_that_is_merely_behind_is_read_until_the_deadline() -> None:
    assert end_read_deadline(AccountingOutlook().view(), AccountingReach.ANSWERED, 100.0, 15) == 15


def test_a_probe_is_due_once_nothing_was_heard_for_the_interval() -> None:
    outlook = AccountingOutlook()
    assert outlook.probe_due(0.0)
    outlook.observe(AccountingReach.UNREACHABLE, at=10.0)
    assert not outlook.probe_due(10.0 + PROBE_INTERVAL - 1)
    assert outlook.probe_due(10.0 + PROBE_INTERVAL)
    outlook.observe(AccountingReach.ANSWERED, at=100.0)
    assert not outlook.view().disabled and not outlook.probe_due(101.0)


def test_a_run_is_told_once_that_accounting_is_away() -> None:
    outlook = AccountingOutlook()
    away = AccountingAnswer(None, "sacct: error: Problem talking to the database: Connection refused")
    first = once_per_run("Accounting of Slurm job 1 showed no final state", away, outlook, "run-a")
    assert first is not None and "once per run" in first and "does not answer" in first
    assert once_per_run("Accounting of Slurm job 2 showed ...", away, outlook, "run-a") is None
    assert once_per_run("Accounting of Slurm job 3 showed ...", away, outlook, "run-b") is not None
    disabled = AccountingAnswer(None, "Slurm accounting storage is disabled")
    told = once_per_run("Accounting of Slurm job 4 showed ...", disabled, outlook, "run-c")
    assert told is not None and "disabled on this cluster" in told


def test_an_answer_behind_is_said_for_every_job() -> None:
    outlook = AccountingOutlook()
    behind = AccountingAnswer(None)  # sacct answered, with no record yet
    for job in ("1", "2"):
        assert once_per_run(f"job {job} lags", behind, outlook, "run-a") == f"job {job} lags"
    assert once_per_run(None, behind, outlook, "run-a") is None
