"""Input checks before anything is rendered: payloads, environment, plans, launcher fields."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers import (
    BashLauncher,
    ComputeLauncher,
    ExecutionPlan,
    PayloadSpec,
    normalize_drain_signal,
    payload_argv,
    resolve_launcher,
    validate_env,
)

JOB_DIR = "/scratch/run 1/job"


def _plan(**overrides: object) -> ExecutionPlan:
    values: dict[str, object] = {
        "payload": ("python", "-m", "pkg"),
        "job_dir": "/jobs/1",
        "status_file": "/jobs/1/status",
        "drain_file": "/jobs/1/drained",
        "mode": "slurm",
    }
    values.update(overrides)
    return ExecutionPlan(**values)  # type: ignore[arg-type]


# --- payload_argv -------------------------------------------------------------------------


def test_local_python_script_is_uploaded_and_run_with_python(tmp_path: Path) -> None:
    script = tmp_path / "my payload.py"
    script.write_text("print(1)\n")
    spec = payload_argv(str(script), job_dir=JOB_DIR)
    assert spec == PayloadSpec(
        argv=("python", f"{JOB_DIR}/my payload.py"),
        upload_from=str(script),
        upload_name="my payload.py",
    )
    assert spec.needs_upload


def test_python_interpreter_can_be_chosen(tmp_path: Path) -> None:
    script = tmp_path / "p.py"
    script.write_text("")
    spec = payload_argv(str(script), job_dir=JOB_DIR, python="/env/bin/python3")
    assert spec.argv == ("/env/bin/python3", f"{JOB_DIR}/p.py")


def test_local_shell_script_is_run_with_bash(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("echo hi\n")
    spec = payload_argv(str(script), job_dir=JOB_DIR)
    assert spec.argv == ("bash", f"{JOB_DIR}/run.sh")
    assert spec.upload_name == "run.sh"


def test_existing_file_without_suffix_is_a_python_script(tmp_path: Path) -> None:
    script = tmp_path / "entrypoint"
    script.write_text("")
    assert payload_argv(str(script), job_dir=JOB_DIR).argv == ("python", f"{JOB_DIR}/entrypoint")


def test_relative_script_path_is_uploaded_from_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    spec = payload_argv("jobs/train.py", job_dir=JOB_DIR)
    assert spec.upload_from == str(tmp_path / "jobs" / "train.py")
    assert spec.argv == ("python", f"{JOB_DIR}/train.py")


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("python -m pkg.module", ("python", "-m", "pkg.module")),
        ("python -m pkg.module --x 1", ("python", "-m", "pkg.module", "--x", "1")),
        ("python /shared/tools/x.py", ("python", "/shared/tools/x.py")),
        ("  torchrun --nproc 4 'my script.py'  ", ("torchrun", "--nproc", "4", "my script.py")),
        ("echo '$(id)' ; rm", ("echo", "$(id)", ";", "rm")),
    ],
)
def test_commands_are_split_into_argv_and_not_uploaded(command: str, argv: tuple[str, ...]) -> None:
    spec = payload_argv(command, job_dir=JOB_DIR)
    assert spec == PayloadSpec(argv=argv)
    assert not spec.needs_upload


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "non-empty"),
        ("   ", "non-empty"),
        ("missing_script.py", "no such local file"),
        ("/nowhere/run.sh", "no such local file"),
        ("python -c 'unbalanced", "cannot be split"),
        ("python x.py\nrm -rf /", "control characters"),
    ],
)
def test_bad_payload_paths_are_rejected(value: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as caught:
        payload_argv(value, job_dir=JOB_DIR)
    assert caught.value.field == "payload_path"


def test_job_dir_must_be_absolute() -> None:
    with pytest.raises(ConfigurationError) as caught:
        payload_argv("python -m x", job_dir="relative/dir")
    assert caught.value.field == "job_dir"


# --- environment ----------------------------------------------------------------------------


def test_valid_env_passes_unchanged() -> None:
    env = {"A": "1", "_B2": "x'y\n$(z)", "PATH": "/bin", "EMPTY": ""}
    assert validate_env(env) == env


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("MY VAR", "x", "not a valid variable name"),
        ("1ABC", "x", "not a valid variable name"),
        ("A-B", "x", "not a valid variable name"),
        ("X;id", "x", "not a valid variable name"),
        ("é", "x", "not a valid variable name"),
        ("", "x", "not a valid variable name"),
        ("UID", "x", "read-only"),
        ("__ds_status_file", "x", "reserved"),
        ("OK", "a\0b", "NUL"),
        ("OK", 3, "must be a string"),
    ],
)
def test_bad_env_entries_name_the_key(name: str, value: object, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as caught:
        validate_env({name: value})  # type: ignore[dict-item]
    assert caught.value.field == f"extra_env[{name!r}]"


def test_env_errors_use_the_given_field_name() -> None:
    with pytest.raises(ConfigurationError) as caught:
        validate_env({"A B": "x"}, field="env")
    assert caught.value.field == "env['A B']"


# --- ExecutionPlan ----------------------------------------------------------------------------


def test_plan_freezes_payload_and_env() -> None:
    env = {"A": "1"}
    plan = _plan(payload=["python", "x.py"], env=env)
    env["B"] = "2"
    assert plan.payload == ("python", "x.py")
    assert dict(plan.env) == {"A": "1"}
    with pytest.raises(TypeError):
        plan.env["C"] = "3"  # type: ignore[index]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"payload": ()}, "payload"),
        ({"payload": "python x.py"}, "payload"),
        ({"payload": ("",)}, "payload"),
        ({"payload": ("python", "a\0b")}, "payload"),
        ({"job_dir": "jobs/1"}, "job_dir"),
        ({"status_file": "/jobs/1/st\natus"}, "status_file"),
        ({"drain_file": ""}, "drain_file"),
        ({"activation": "env/bin/activate"}, "activation"),
        ({"pid_file": "pid"}, "pid_file"),
        ({"mode": "cloud"}, "mode"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"num_nodes": True}, "num_nodes"),
        ({"drain_signal": "KILL"}, "drain_signal"),
        ({"drain_signal": "10"}, "drain_signal"),
        ({"drain_signal": "USR1; id"}, "drain_signal"),
        ({"env": {"BAD NAME": "x"}}, "env['BAD NAME']"),
    ],
)
def test_bad_plans_are_rejected_naming_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _plan(**overrides)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("given", "canonical"),
    [(None, "TERM"), ("USR1", "USR1"), ("sigusr2", "USR2"), ("SIGTERM", "TERM"), ("int", "INT")],
)
def test_drain_signal_is_normalised(given: str | None, canonical: str) -> None:
    assert _plan(drain_signal=given).drain_signal_name == canonical


def test_stop_is_rejected_as_drain_signal() -> None:
    with pytest.raises(ConfigurationError, match="cannot be trapped"):
        normalize_drain_signal("signal", "SIGSTOP")


# --- launcher configuration -------------------------------------------------------------------


def test_unknown_launcher_field_is_rejected_by_name() -> None:
    with pytest.raises(ValidationError, match="pre_start_command") as caught:
        BashLauncher(pre_start_command=["module load x"])  # type: ignore[call-arg]
    assert (
        "unknown field 'pre_start_command'; did you mean 'pre_start_commands'?"
        in str(caught.value)
    )


def test_pre_start_commands_with_nul_are_rejected() -> None:
    with pytest.raises(ValidationError, match=r"pre_start_commands\[1\]"):
        BashLauncher(pre_start_commands=["ok", "bad\0"])


def test_base_launcher_cannot_be_used_directly() -> None:
    with pytest.raises(TypeError):
        ComputeLauncher()  # type: ignore[abstract]


def test_resolve_launcher_prefers_the_first_given() -> None:
    asset_launcher = BashLauncher(pre_start_commands=["true"])
    default = BashLauncher()
    assert resolve_launcher(asset_launcher, default) is asset_launcher
    assert resolve_launcher(None, default) is default
    assert isinstance(resolve_launcher(None, None), BashLauncher)


class _UsesLauncher(dg.ConfigurableResource):
    default_launcher: ComputeLauncher | None = None


def test_launcher_can_be_a_field_of_a_resource_and_keeps_its_type() -> None:
    seen: list[ComputeLauncher | None] = []

    @dg.asset
    def uses(res: _UsesLauncher) -> None:
        seen.append(res.default_launcher)

    launcher = BashLauncher(pre_start_commands=["module load x"])
    result = dg.materialize([uses], resources={"res": _UsesLauncher(default_launcher=launcher)})
    assert result.success
    assert isinstance(seen[0], BashLauncher)
    assert seen[0].pre_start_commands == ["module load x"]
