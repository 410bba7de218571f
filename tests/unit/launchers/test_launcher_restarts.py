"""A job Slurm starts a second time does not start its payload again unless allowed.

The rendered job script is run twice in the same job directory with the environment Slurm
gives a batch job (``SLURM_JOB_ID``; ``SLURM_RESTART_COUNT`` after a requeue), as a
controller that lost its state or a requeue would start it.
"""

from __future__ import annotations

from pathlib import Path

from launcher_support import JobFiles, run_script

from dagster_slurm.protocol import REQUEUE_REFUSAL, REQUEUED_STATUS

SLURM = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "c7"}


def _counting(job: JobFiles, tmp_path: Path, **plan: object) -> tuple[Path, Path]:
    starts = tmp_path / "starts"
    script = job.write(job.plan(["/bin/sh", "-c", f"echo started >> {starts}"], mode="slurm",
                                **plan))
    return script, starts


def test_a_second_start_of_the_same_job_does_not_start_the_payload(job, tmp_path) -> None:
    script, starts = _counting(job, tmp_path)
    assert run_script(script, env=SLURM).returncode == 0
    second = run_script(script, env=SLURM)
    assert second.returncode == REQUEUED_STATUS
    assert job.status() == REQUEUED_STATUS
    assert starts.read_text() == "started\n"
    assert "Slurm started this job a second time, now on c7" in second.stderr
    assert REQUEUE_REFUSAL in second.stderr


def test_a_requeued_job_does_not_start_the_payload(job, tmp_path) -> None:
    script, starts = _counting(job, tmp_path)
    result = run_script(script, env={**SLURM, "SLURM_RESTART_COUNT": "1"})
    assert result.returncode == REQUEUED_STATUS
    assert not starts.exists()
    assert "Slurm restarted this job (restart 1)" in result.stderr
    assert REQUEUE_REFUSAL in result.stderr


def test_another_job_or_step_in_the_same_directory_is_a_first_start(job, tmp_path) -> None:
    script, starts = _counting(job, tmp_path)
    assert run_script(script, env=SLURM).returncode == 0
    assert run_script(script, env={**SLURM, "SLURM_JOB_ID": "4243"}).returncode == 0
    assert run_script(script, env={**SLURM, "SLURM_STEP_ID": "3"}).returncode == 0
    assert starts.read_text() == "started\n" * 3


def test_with_restarts_allowed_the_payload_starts_again_and_says_so(job, tmp_path) -> None:
    script, starts = _counting(job, tmp_path, restart_allowed=True)
    assert run_script(script, env=SLURM).returncode == 0
    second = run_script(script, env={**SLURM, "SLURM_RESTART_COUNT": "1"})
    assert second.returncode == 0
    assert starts.read_text() == "started\n" * 2
    assert "the payload starts again from the beginning (requeue=True)" in second.stderr
    assert REQUEUE_REFUSAL not in second.stderr


def test_local_mode_keeps_no_start_marker(job, tmp_path) -> None:
    starts = tmp_path / "starts"
    script = job.write(job.plan(["/bin/sh", "-c", f"echo started >> {starts}"]))
    assert run_script(script, env=SLURM).returncode == 0
    assert run_script(script, env=SLURM).returncode == 0
    assert starts.read_text() == "started\n" * 2
