"""Heterogeneous jobs in squeue and sacct output: one record per job, under its own id."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.commands import SQUEUE_FORMAT
from dagster_slurm.slurm.het_records import (
    fold_accounting_records,
    fold_queue_records,
    folded_state,
    het_member,
)
from dagster_slurm.slurm.parsers import parse_squeue
from dagster_slurm.slurm.states import JobState

S = JobState


def _squeue_line(job_id: str, state: str, nodes: str, partition: str) -> str:
    # Columns of SQUEUE_FORMAT: id|name|state|reason|left|limit|start|end|nodes|n|tres|part|cpus|mem|elapsed|comment
    assert SQUEUE_FORMAT.count("|") == 15
    return (f"{job_id}|dsl-het|{state}|None|9:50|10:00|2026-12-02T06:17:48|N/A|{nodes}|1|N/A|"
            f"{partition}|1|500M|0:10|tok-het")


def test_component_ids_are_recognised_and_nothing_else():
    assert het_member("123+1") == ("123", 1)
    assert het_member("123+0") == ("123", 0)
    for other in ("123", "123_4", "123+", "+1", "123+1.batch", "abc+1"):
        assert het_member(other) is None


def test_squeue_component_lines_become_one_record_under_the_job_id():
    text = "\n".join([_squeue_line("41+0", "RUNNING", "c1", "cpu"),
                      _squeue_line("41+1", "RUNNING", "g1", "gpu"),
                      _squeue_line("42", "PENDING", "", "cpu")])
    records = fold_queue_records({r.job_id: r for r in parse_squeue(text)})
    assert sorted(records) == ["41", "42"]
    assert records["41"].state is S.RUNNING
    assert records["41"].node_list == "c1" and records["41"].comment == "tok-het"
    assert records["42"].state is S.PENDING


@pytest.mark.parametrize(("states", "expected"), [
    ([S.RUNNING, S.RUNNING], S.RUNNING),
    ([S.PENDING, S.PENDING], S.PENDING),
    # the batch component ended but another one is still being cleaned up: not over yet
    ([S.COMPLETED, S.COMPLETING], S.COMPLETING),
    ([S.FAILED, S.RUNNING], S.RUNNING),
    ([S.COMPLETED, S.UNKNOWN], S.UNKNOWN),
    # every component ended: component 0's state, unless it claims success another denies
    ([S.COMPLETED, S.COMPLETED], S.COMPLETED),
    ([S.COMPLETED, S.NODE_FAIL], S.NODE_FAIL),
    ([S.FAILED, S.COMPLETED], S.FAILED),
    ([S.CANCELLED, S.CANCELLED], S.CANCELLED),
    ([S.TIMEOUT, S.CANCELLED], S.TIMEOUT),
    ([], S.UNKNOWN),
])
def test_folded_state(states, expected):
    assert folded_state(states) is expected


def test_a_job_whose_component_0_is_not_listed_has_an_unknown_state():
    text = _squeue_line("41+1", "COMPLETED", "g1", "gpu")
    records = fold_queue_records({r.job_id: r for r in parse_squeue(text)})
    assert records["41"].state is S.UNKNOWN


# sacct --parsable2 output of a heterogeneous job on the dev cluster (Slurm 22.05), with the
# columns of SACCT_FIELDS: JobID|JobName|State|ExitCode|Elapsed|ElapsedRaw|MaxRSS|TotalCPU|
# NNodes|NodeList|AllocCPUS|Start|End
SACCT_HET = """\
7+0|dsl-het|COMPLETED|0:0|00:00:03|3||00:00.500|1|c1|1|2026-12-02T06:17:48|2026-12-02T06:17:51
7+0.batch|batch|COMPLETED|0:0|00:00:03|3|20480K|00:00.400|1|c1|1|2026-12-02T06:17:48|2026-12-02T06:17:51
7+1|dsl-het|COMPLETED|0:0|00:00:03|3||00:00.100|1|g1|1|2026-12-02T06:17:48|2026-12-02T06:17:51
7+1.0|bash|COMPLETED|0:0|00:00:01|1|40960K|00:00.100|1|g1|1|2026-12-02T06:17:49|2026-12-02T06:17:50
8|other|FAILED|2:0|00:00:01|1||00:00.010|1|c2|1|2026-12-02T06:17:48|2026-12-02T06:17:49
"""


def test_sacct_component_lines_become_one_record_with_every_step():
    records = fold_accounting_records(parse_sacct(SACCT_HET))
    assert sorted(records) == ["7", "8"]
    het = records["7"]
    assert het.state is S.COMPLETED and het.exit_code == 0
    assert het.node_list == "c1"  # component 0's figures
    assert [step.step_id for step in het.steps] == ["batch", "+1.0"]
    assert het.max_rss_bytes == 40960 * 1024  # the largest of any component
    assert records["8"].state is S.FAILED and records["8"].exit_code == 2


def test_ordinary_records_pass_unchanged():
    plain = parse_sacct(SACCT_HET.splitlines()[-1])
    assert fold_accounting_records(plain) == plain


def test_a_poll_shows_a_heterogeneous_job_under_its_own_id():
    from dagster_slurm.agent.results import JobStatusResult
    from dagster_slurm.scheduler.client import SlurmScheduler

    squeue = "\n".join([_squeue_line("41+0", "COMPLETED", "c1", "cpu"),
                        _squeue_line("41+1", "COMPLETING", "g1", "gpu")])
    raw = {"squeue": {"rc": 0, "stdout": squeue, "stderr": ""}, "absent_ids": []}
    snapshot = SlurmScheduler(agent=None).snapshot(JobStatusResult.from_raw(raw), 0.0)
    observed = snapshot.job("41")
    assert observed.state is S.COMPLETING and not observed.terminal
    assert snapshot.ended_state("41") is None


# What never happens, whatever the components' states: a job reported ended while one of its
# components is not, or reported COMPLETED while one of them ended otherwise.
_STATES = st.lists(st.sampled_from(list(JobState)), min_size=1, max_size=4)


@given(_STATES)
def test_folding_never_ends_a_job_early_or_too_well(states):
    folded = folded_state(states)
    if folded.terminal:
        assert all(state.terminal for state in states)
    if folded is S.COMPLETED:
        assert all(state is S.COMPLETED for state in states)
