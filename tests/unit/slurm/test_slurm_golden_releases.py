"""Every parser against real output of each Slurm release (``golden/<release>/roles/``).

The files were recorded on dev clusters by ``scripts/record_slurm_roles.py``: the same
tiny jobs in partition ``cpu`` on each release (one running, one pending on ``--begin``,
one held, one completed with an srun step, one failed with exit code 3, one cancelled, one
timed out), then the output of every command the library parses, built by the library's
own argv builders for that release. ``manifest.json`` holds the release, the job id of each
role, and per recording the command, its exit status and which stream was kept.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import dagster_slurm.agent.remote.scheduler as agent_scheduler
from dagster_slurm.agent.remote.scheduler import parse_job_id, squeue_then_sacct
from dagster_slurm.devcluster.probes import parse_node_states
from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.commands import (
    sacct_argv,
    squeue_argv,
    squeue_observe_argv,
    squeue_state_argv,
)
from dagster_slurm.slurm.parsers import (
    min_job_age_seconds,
    parse_sbatch_parsable,
    parse_scontrol_config,
    parse_squeue,
)
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.test_only import parse_test_only
from dagster_slurm.slurm.version import SlurmFeature, SlurmVersion, parse_slurm_version

GOLDEN = Path(__file__).parent / "golden"
RELEASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "roles" / "manifest.json").is_file())

#: Final state of each role's job as squeue and sacct print it.
ROLE_STATES = {
    "running": JobState.RUNNING,
    "pending": JobState.PENDING,
    "held": JobState.PENDING,
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "cancelled": JobState.CANCELLED,
    "timeout": JobState.TIMEOUT,
}
#: sacct AllocCPUS of a job that waits: the request on 22.05, nothing allocated on 24.11.
PENDING_ALLOC_CPUS = {"22.05": 1, "24.11": 0}
ROLE_REASONS = {"pending": "BeginTime", "held": "JobHeldUser", "failed": "NonZeroExitCode",
                "timeout": "TimeLimit", "running": None}


class Release:
    """One release's recordings."""

    def __init__(self, name: str) -> None:
        self.dir = GOLDEN / name / "roles"
        self.manifest: dict[str, Any] = json.loads((self.dir / "manifest.json").read_text())
        self.jobs: dict[str, str] = self.manifest["jobs"]
        version = parse_slurm_version(self.manifest["version"])
        assert version is not None
        self.version: SlurmVersion = version

    def text(self, name: str) -> str:
        return (self.dir / self.manifest["recordings"][name]["file"]).read_text()

    def rc(self, name: str) -> int:
        return self.manifest["recordings"][name]["rc"]

    def argv(self, name: str) -> list[str]:
        return self.manifest["recordings"][name]["argv"]

    def names(self) -> list[str]:
        """The job names of the recording, in role order (as the recorder submitted them)."""
        prefix = self.argv("sbatch_parsable_running")
        name = next(a for a in prefix if a.startswith("--job-name=")).partition("=")[2]
        stem = name.rsplit("-", 1)[0]
        return [f"{stem}-{role}" for role in ROLE_STATES]

    def ids(self) -> list[str]:
        """The job ids in role order (as the recorder submitted them)."""
        return [self.jobs[role] for role in ROLE_STATES]


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest) -> Release:
    return Release(request.param)


def test_both_releases_are_recorded() -> None:
    assert {"22.05", "24.11"} <= set(RELEASES)


def test_the_version_line_is_read(release: Release) -> None:
    version = parse_slurm_version(release.text("version"))
    assert version == release.version and version.series == release.dir.parent.name


def test_the_recorded_commands_are_the_ones_the_library_builds(release: Release) -> None:
    version, names, ids = release.version, release.names(), release.ids()
    assert release.argv("squeue") == squeue_argv(names, version=version)
    assert release.argv("squeue_observe") == squeue_observe_argv(names, version=version)
    assert release.argv("sacct") == sacct_argv(ids, version=version)
    assert release.argv("squeue_state") == squeue_state_argv(names, [*ids, "999999"],
                                                             version=version)


@pytest.mark.parametrize("role", list(ROLE_STATES))
def test_sbatch_parsable_gives_the_job_id(release: Release, role: str) -> None:
    text = release.text(f"sbatch_parsable_{role}")
    assert parse_sbatch_parsable(text) == release.jobs[role]
    assert parse_job_id(text) == release.jobs[role]  # the agent reads it too


@pytest.mark.parametrize("recording", ["squeue", "squeue_observe"])
def test_squeue_listings_give_every_jobs_state_and_fields(release: Release, recording: str) -> None:
    records = {r.job_id: r for r in parse_squeue(release.text(recording))}
    assert set(records) == set(release.jobs.values())
    for role, job_id in release.jobs.items():
        record = records[job_id]
        assert record.state is ROLE_STATES[role], role
        assert record.name is not None and record.name.endswith(f"-{role}")
        assert record.comment == f"tok-{role}"
        assert record.partition == "cpu" and record.cpus == 1
        assert record.min_memory_bytes == 100 * 1024**2
        assert record.time_limit_seconds == (60.0 if role == "timeout" else 600.0)
        if role in ROLE_REASONS:
            assert record.reason == ROLE_REASONS[role], role
        if ROLE_STATES[role] is JobState.PENDING:
            assert record.nodes == () and record.node_list is None
        else:
            assert record.nodes is not None and len(record.nodes) == 1
            assert record.start_time is not None and record.end_time is not None
    assert records[release.jobs["timeout"]].time_left_seconds is None  # INVALID: overran
    assert records[release.jobs["held"]].start_time is None
    if recording == "squeue_observe":
        assert all("cpu=1" in (r.tres_alloc or "") for r in records.values())


def test_the_state_poll_lists_states_by_id(release: Release) -> None:
    text = release.text("squeue_state")
    records = {r.job_id: r for r in parse_squeue(text)}
    assert release.rc("squeue_state") == 0
    assert {j: r.state for j, r in records.items()} == {
        release.jobs[role]: state for role, state in ROLE_STATES.items()}
    if release.version.offers(SlurmFeature.ONLY_JOB_STATE):
        # only id and state are filled in; an id the controller does not know is left out
        assert all(r.name is None and r.reason is None and r.nodes == () for r in records.values())
    else:
        assert text == release.text("squeue")  # 22.05: the full listing instead


def test_the_agent_reads_the_state_polls_ids_and_asks_sacct_for_the_unknown_one(
    release: Release, monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = release.text("squeue_state")
    known = [*release.ids(), "999999"]
    ran: list[list[str]] = []

    def squeue(argv: list[str], timeout: float) -> dict:
        ran.append(argv)
        return {"rc": 0, "stdout": text, "stderr": ""}

    monkeypatch.setattr(agent_scheduler, "_run_quietly", squeue)
    result = squeue_then_sacct({"sacct_argv": ["sacct"]}, ["squeue"], known, 10.0)
    assert result["absent_ids"] == ["999999"]
    assert ran[-1] == ["sacct", "--jobs=999999"]


def test_only_job_state_is_refused_where_the_release_lacks_it(release: Release) -> None:
    if release.version.offers(SlurmFeature.ONLY_JOB_STATE):
        assert release.rc("squeue_only_job_state_raw") == 0
        assert release.text("squeue_only_job_state_raw").startswith("JOBID|STATE")
    else:
        assert release.rc("squeue_only_job_state_raw") != 0
        assert "--only-job-state" in release.text("squeue_only_job_state_stderr")


def test_sacct_gives_every_jobs_outcome(release: Release) -> None:
    records = parse_sacct(release.text("sacct"))
    assert set(records) == set(release.jobs.values())
    for role, job_id in release.jobs.items():
        assert records[job_id].state is ROLE_STATES[role], role
    jobs = {role: records[job_id] for role, job_id in release.jobs.items()}
    assert jobs["failed"].exit_code == 3 and jobs["completed"].exit_code == 0
    assert jobs["cancelled"].cancelled_by is not None
    assert jobs["cancelled"].raw_state.startswith("CANCELLED by ")
    assert {"batch", "0"} <= {step.step_id for step in jobs["completed"].steps}
    assert jobs["timeout"].elapsed_seconds is not None and jobs["timeout"].elapsed_seconds >= 60
    assert jobs["pending"].nodes == () and jobs["pending"].start_time is None
    assert jobs["running"].end_time is None and jobs["running"].nodes is not None
    for role, record in jobs.items():
        assert record.name is not None
        if ROLE_STATES[role] is JobState.PENDING:
            # nothing allocated yet: 22.05 printed the request (1), 24.11 prints 0
            assert record.alloc_cpus == PENDING_ALLOC_CPUS[release.version.series], role
        else:
            assert record.alloc_cpus == 1, role
    if release.version.offers(SlurmFeature.SACCT_PLANNED):
        assert jobs["completed"].planned_seconds is not None
        assert not math.isinf(jobs["completed"].planned_seconds)
        assert jobs["pending"].planned_seconds is None  # Slurm prints INVALID before --begin
    else:
        assert all(r.planned_seconds is None for r in jobs.values())


def test_sacct_in_the_22_05_columns_reads_the_same(release: Release) -> None:
    full = parse_sacct(release.text("sacct"))
    base = parse_sacct(release.text("sacct_22_05_fields"))
    assert {j: r.state for j, r in base.items()} == {j: r.state for j, r in full.items()}
    assert {j: r.exit_code for j, r in base.items()} == {j: r.exit_code for j, r in full.items()}


def test_test_only_answers(release: Release) -> None:
    runnable = parse_test_only(release.text("test_only_runnable"), release.rc("test_only_runnable"))
    assert runnable.runnable is True and runnable.partition == "cpu"
    assert runnable.processors == 1 and runnable.start_time is not None
    assert runnable.nodes is not None and len(runnable.nodes) == 1
    bad = parse_test_only(release.text("test_only_bad_partition"),
                          release.rc("test_only_bad_partition"))
    assert bad.runnable is False and bad.error is not None and "partition" in bad.error.lower()
    big = parse_test_only(release.text("test_only_too_big"), release.rc("test_only_too_big"))
    assert big.runnable is False and big.error is not None


def test_scontrol_show_config(release: Release) -> None:
    config = parse_scontrol_config(release.text("scontrol_show_config"))
    assert min_job_age_seconds(config) is not None
    assert config.get("SLURM_VERSION") == str(release.version)


def test_scontrol_show_node_states(release: Release) -> None:
    states = parse_node_states(release.text("scontrol_show_node_oneliner"))
    assert {"c1", "c2"} <= set(states)
    assert all(state.base for state in states.values())
