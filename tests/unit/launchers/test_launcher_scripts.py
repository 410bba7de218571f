"""Generated job scripts, run for real with bash: exit status, environment, activation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from launcher_support import PYTHON, JobFiles, run_script

from dagster_slurm.launchers import BashLauncher

DUMP_ENV = (
    "import json, os, sys\n"
    "names = sys.argv[2:]\n"
    "with open(sys.argv[1], 'w', encoding='utf-8') as f:\n"
    "    json.dump({n: os.environ.get(n) for n in names}, f)\n"
)

NASTY_VALUES = {
    "SINGLE": "it's",
    "DOUBLE": 'say "hi"',
    "SUBST": "$(touch {marker})",
    "BACKTICK": "`touch {marker}`",
    "SEMI": "x; touch {marker}; y",
    "NEWLINE": "first line\nsecond line\n; touch {marker}",
    "DOLLAR": "$HOME ${{PATH}} $$ $0 \\$",
    "GLOB": "* ? [a-z] ~",
    "EMPTY": "",
    "UNICODE": "héllo wörld ✓",
}


@pytest.mark.parametrize("code", [0, 1, 3, 42, 255])
def test_payload_exit_status_reaches_status_file_and_exit_code(job: JobFiles, code: int) -> None:
    script = job.write(job.plan(("sh", "-c", f"exit {code}")))
    result = run_script(script)
    assert result.returncode == code
    assert job.status() == code
    assert job.drained() is None
    assert job.status_file.read_text() == f"{code}\n"
    assert sorted(p.name for p in job.job_dir.iterdir()) == ["job.sh", "payload.pid", "status"]


def test_payload_runs_in_job_dir_and_output_is_not_redirected(job: JobFiles) -> None:
    script = job.write(job.plan(("sh", "-c", "pwd; echo to-stderr >&2")))
    result = run_script(script)
    assert result.returncode == 0
    assert result.stdout == f"{job.job_dir}\n"
    assert "to-stderr" in result.stderr


def test_env_values_arrive_literally_and_nothing_is_executed(job: JobFiles, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    env = {name: value.format(marker=marker) for name, value in NASTY_VALUES.items()}
    dump = job.job_dir / "env.json"
    script = job.write(job.plan((PYTHON, "-c", DUMP_ENV, str(dump), *env), env=env))
    result = run_script(script)
    assert result.returncode == 0, result.stderr
    assert json.loads(dump.read_text(encoding="utf-8")) == env
    assert not marker.exists()


def test_argv_words_arrive_literally(job: JobFiles, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    words = [value.format(marker=marker) for value in NASTY_VALUES.values()]
    dump = job.job_dir / "argv.json"
    program = "import json, sys\njson.dump(sys.argv[2:], open(sys.argv[1], 'w'))\n"
    script = job.write(job.plan((PYTHON, "-c", program, str(dump), *words)))
    assert run_script(script).returncode == 0
    assert json.loads(dump.read_text()) == words
    assert not marker.exists()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    values=st.lists(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")),
        min_size=1,
        max_size=4,
    )
)
def test_any_env_value_arrives_literally(job: JobFiles, values: list[str]) -> None:
    env = {f"V{index}": value for index, value in enumerate(values)}
    dump = job.job_dir / "env.json"
    script = job.write(job.plan((PYTHON, "-c", DUMP_ENV, str(dump), *env), env=env))
    result = run_script(script)
    assert result.returncode == 0, result.stderr
    assert json.loads(dump.read_text(encoding="utf-8")) == env


def test_paths_with_spaces_and_quotes_are_taken_literally(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    odd = JobFiles.under(tmp_path, f'it\'s a "job" $(touch {marker}) `x`; dir')
    script = odd.write(odd.plan(("sh", "-c", "pwd > where; exit 7")))
    result = run_script(script)
    assert result.returncode == 7, result.stderr
    assert odd.status() == 7
    assert (odd.job_dir / "where").read_text() == f"{odd.job_dir}\n"
    assert not marker.exists()


def _fake_env(root: Path) -> Path:
    """A directory with an activate script that sets a variable and puts a fake ``python``
    first on PATH."""
    bin_dir = root / "env dir" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "python"
    fake.write_text('#!/bin/sh\necho "fake python $FROM_ACTIVATION $*"\n')
    fake.chmod(0o755)
    activate = bin_dir / "activate"
    activate.write_text(
        f'export FROM_ACTIVATION="activated"\nexport PATH="{bin_dir}:$PATH"\n'
        'echo "$UNSET_IN_ACTIVATION" > /dev/null\n'  # not written for set -u
    )
    return activate


def test_activation_is_sourced_and_python_is_found_on_path_afterwards(
    job: JobFiles, tmp_path: Path
) -> None:
    activate = _fake_env(tmp_path)
    script = job.write(job.plan(("python", "-m", "pkg.mod"), activation=str(activate)))
    result = run_script(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "fake python activated -m pkg.mod\n"


def test_env_is_exported_before_activation(job: JobFiles, tmp_path: Path) -> None:
    activate = tmp_path / "activate.sh"
    activate.write_text('export SEEN_BY_ACTIVATION="$FROM_PLAN"\n')
    plan = job.plan(
        ("sh", "-c", 'echo "$SEEN_BY_ACTIVATION"'),
        env={"FROM_PLAN": "plan value"},
        activation=str(activate),
    )
    result = run_script(job.write(plan))
    assert result.stdout == "plan value\n"


def test_missing_activation_fails_clearly_with_127(job: JobFiles, tmp_path: Path) -> None:
    missing = tmp_path / "no such env" / "activate"
    ran = job.job_dir / "ran"
    plan = job.plan(("touch", str(ran)), activation=str(missing))
    result = run_script(job.write(plan))
    assert result.returncode == 127
    assert job.status() == 127
    assert f"activation script not found or not readable: {missing}" in result.stderr
    assert not ran.exists()


def test_failing_activation_fails_with_126(job: JobFiles, tmp_path: Path) -> None:
    activate = tmp_path / "activate.sh"
    activate.write_text("return 3\n")
    ran = job.job_dir / "ran"
    result = run_script(job.write(job.plan(("touch", str(ran)), activation=str(activate))))
    assert result.returncode == 126
    assert job.status() == 126
    assert "failed with status 3" in result.stderr
    assert not ran.exists()


def test_pre_start_commands_run_in_order_in_the_job_shell(job: JobFiles) -> None:
    launcher = BashLauncher(
        pre_start_commands=[
            'export FROM_SETUP="one"',
            "if true; then",
            '  FROM_SETUP="$FROM_SETUP two"',
            "fi",
            "false",  # a failing line does not stop the job
            "echo setup-ran >&2",
        ]
    )
    plan = job.plan(("sh", "-c", 'echo "$FROM_SETUP"'))
    result = run_script(job.write(plan, launcher))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "one two\n"
    assert "setup-ran" in result.stderr


def test_exit_in_pre_start_commands_is_recorded(job: JobFiles) -> None:
    ran = job.job_dir / "ran"
    launcher = BashLauncher(pre_start_commands=["module-load-failed || exit 5"])
    result = run_script(job.write(job.plan(("touch", str(ran))), launcher))
    assert result.returncode == 5
    assert job.status() == 5
    assert not ran.exists()


def test_missing_program_gives_127(job: JobFiles) -> None:
    result = run_script(job.write(job.plan(("no-such-program-xyz", "arg"))))
    assert result.returncode == 127
    assert job.status() == 127


def test_missing_job_dir_gives_125(job: JobFiles, tmp_path: Path) -> None:
    plan = job.plan(("true",), job_dir=str(tmp_path / "gone"))
    result = run_script(job.write(plan))
    assert result.returncode == 125
    assert job.status() == 125
    assert "cannot enter the job directory" in result.stderr


def test_pid_file_holds_the_payload_process_group(job: JobFiles) -> None:
    program = "import os, sys\nprint(os.getpid(), os.getpgrp(), os.getppid())\n"
    result = run_script(job.write(job.plan((PYTHON, "-c", program))))
    _, pgid, _ = (int(word) for word in result.stdout.split())
    assert pgid == int(job.pid_file.read_text())
    assert pgid != os.getpgrp()


def test_the_payload_status_is_recorded_by_its_runner_and_the_record_removed(job: JobFiles) -> None:
    # the payload's own status comes from the record its runner writes (a status bash can no
    # longer tell after reaping the payload inside a trap); the record does not outlive it
    result = run_script(job.write(job.plan(("bash", "-c", "exit 7"))))
    assert result.returncode == 7
    assert job.status_file.read_text().strip() == "7"
    assert not os.path.exists(f"{job.status_file}.payload")


def test_a_stale_record_from_an_earlier_start_is_not_taken(job: JobFiles) -> None:
    # a record left by an earlier start of the job (killed before it could remove it) is
    # removed before the payload starts: the status is this start's
    job.job_dir.mkdir(parents=True, exist_ok=True)
    Path(f"{job.status_file}.payload").write_text("9\n")
    result = run_script(job.write(job.plan(("sh", "-c", "exit 0"))))
    assert result.returncode == 0
    assert job.status_file.read_text() == "0\n"
    assert sorted(p.name for p in job.job_dir.iterdir()) == ["job.sh", "payload.pid", "status"]
