"""SlurmRunConfig, the published package's run configuration of an asset: it is a Dagster
Config an asset takes and hands to ``compute.run(config=...)``; ``skip_payload_upload`` with
``remote_payload_path`` runs the script already on the cluster (slurm mode), and every field
that cannot be honoured is refused, saying what to use instead, before anything starts."""

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic import Field, ValidationError
from slurm_capture_support import capture_slurm_runs

import dagster_slurm
from dagster_slurm import (
    ComputeResource,
    ConfigurationError,
    SlurmResource,
    SlurmRunConfig,
    SSHConnectionResource,
)
from dagster_slurm.compute.run_config import payload_command
from dagster_slurm.launchers.base import payload_argv


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[Any]]:
    """The requests that have reached the asset-scope Slurm runner (which does nothing)."""
    calls = capture_slurm_runs(monkeypatch)
    return lambda: [request for _, request in calls]


def _slurm_compute() -> ComputeResource:
    ssh = SSHConnectionResource(host="login.invalid", user="me")
    return ComputeResource(mode="slurm", slurm=SlurmResource(ssh=ssh, remote_base="/base"))


def _run_in_asset(compute: ComputeResource, **kwargs: Any) -> None:
    """``compute.run(context, **kwargs)`` from inside a materialized asset (its failure raised)."""

    @dg.asset(name="configured")
    def configured(context: dg.AssetExecutionContext) -> None:
        compute.run(context=context, **kwargs)

    dg.materialize([configured])


def test_it_is_exported_with_the_published_fields() -> None:
    assert dagster_slurm.SlurmRunConfig is SlurmRunConfig and "SlurmRunConfig" in dagster_slurm.__all__
    assert set(SlurmRunConfig.model_fields) == {
        "force_env_push", "skip_payload_upload", "remote_payload_path", "environment_name",
        "extra_files"}
    assert issubclass(SlurmRunConfig, dg.Config)


def test_the_defaults_run_the_payload_as_given(submitted: Callable[[], list[Any]], tmp_path: Path) -> None:
    script = tmp_path / "process.py"
    script.write_text("print('hello')\n")
    _run_in_asset(_slurm_compute(), payload_path=str(script), config=SlurmRunConfig())
    (request,) = submitted()
    assert request.payload_path == str(script)
    assert payload_argv(request.payload_path, job_dir="/job").needs_upload


@pytest.mark.parametrize("remote, argv", [
    ("/shared/scripts/process.py", ("python", "/shared/scripts/process.py")),
    ("/shared/scripts/report.sh", ("bash", "/shared/scripts/report.sh")),
    ("/shared/my scripts/x.py", ("python", "/shared/my scripts/x.py")),
])
def test_a_script_on_the_cluster_runs_instead_of_an_upload(
        submitted: Callable[[], list[Any]], remote: str, argv: tuple[str, ...]) -> None:
    config = SlurmRunConfig(skip_payload_upload=True, remote_payload_path=remote)
    _run_in_asset(_slurm_compute(), payload_path="process.py", config=config)
    (request,) = submitted()
    assert request.payload_path == payload_command(remote)
    spec = payload_argv(request.payload_path, job_dir="/job")
    assert spec.argv == argv and not spec.needs_upload


@pytest.mark.parametrize("fields, field, text", [
    ({"force_env_push": True}, "force_env_push",
     "a packed environment is named by a hash of its content"),
    ({"environment_name": "gpu"}, "environment_name",
     "as asset metadata slurm_pre_deployed_env_path"),
    ({"extra_files": ["model.yaml"]}, "extra_files",
     "pass their paths through extra_env or extras"),
    ({"skip_payload_upload": True}, "skip_payload_upload", "needs remote_payload_path"),
    ({"remote_payload_path": "/x.py"}, "remote_payload_path",
     "is used only with skip_payload_upload=True"),
    ({"skip_payload_upload": True, "remote_payload_path": "x.py"}, "remote_payload_path",
     "must be an absolute path on the cluster"),
])
def test_a_field_that_cannot_be_honoured_is_refused(fields: dict[str, Any], field: str,
                                                    text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        SlurmRunConfig(**fields)
    cause = caught.value.errors()[0]["ctx"]["error"]
    assert isinstance(cause, ConfigurationError) and cause.field == field
    assert text in cause.problem


def test_an_empty_list_of_extra_files_asks_for_nothing() -> None:
    assert SlurmRunConfig(extra_files=[]).extra_files == []


def test_config_must_be_a_slurm_run_config(submitted: Callable[[], list[Any]]) -> None:
    with pytest.raises(ConfigurationError, match="must be a SlurmRunConfig"):
        _slurm_compute().run(context=dg.build_asset_context(), payload_path="python -m x",
                             config={"skip_payload_upload": True})  # type: ignore[arg-type]
    assert submitted() == []


class TrainingConfig(SlurmRunConfig):
    """An asset's own configuration beside the published fields."""

    epochs: int = Field(default=1, description="Passes over the data.")


@dg.asset
def train(context: dg.AssetExecutionContext, compute: ComputeResource,
          config: TrainingConfig) -> None:
    compute.run(context=context, payload_path="python -m train",
                extra_env={"EPOCHS": str(config.epochs)}, config=config)


def test_launchpad_values_reach_compute_run(submitted: Callable[[], list[Any]]) -> None:
    run_config = {"ops": {"train": {"config": {
        "epochs": 3, "skip_payload_upload": True, "remote_payload_path": "/shared/train.py"}}}}
    result = dg.materialize([train], resources={"compute": _slurm_compute()},
                            run_config=run_config)
    assert result.success
    (request,) = submitted()
    assert (request.payload_path, request.extra_env["EPOCHS"]) == ("python /shared/train.py", "3")


def test_a_launchpad_value_that_cannot_be_honoured_fails_before_anything_starts(
        submitted: Callable[[], list[Any]]) -> None:
    run_config = {"ops": {"train": {"config": {"force_env_push": True}}}}
    result = dg.materialize([train], resources={"compute": _slurm_compute()},
                            run_config=run_config, raise_on_error=False)
    assert not result.success and submitted() == []
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "force_env_push=True: cannot be honoured" in str(failure.step_failure_data.error)


def test_local_mode_runs_the_local_payload(tmp_path: Path) -> None:
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent("""
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            pipes.report_asset_materialization(metadata={"ran": "local copy"})
    """))

    @dg.asset
    def local_thing(context: dg.AssetExecutionContext, compute: ComputeResource,
                    config: SlurmRunConfig):
        yield from compute.run(context=context, payload_path=str(payload), config=config).get_results()

    run_config = {"ops": {"local_thing": {"config": {
        "skip_payload_upload": True, "remote_payload_path": "/only/on/the/cluster.py"}}}}
    compute = ComputeResource(mode="local", local_base_path=str(tmp_path / "base"))
    result = dg.materialize([local_thing], resources={"compute": compute}, run_config=run_config)
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["ran"].value == "local copy"
