"""Asset metadata the published package read: ``slurm_pre_deployed_env_path`` gives an
asset an environment of its own (asset scope; in run scope only the run's own); every
other key it read (``slurm_pack_cmd``, ``slurm_environment_name`` ...) is refused before
anything starts, naming the key, the value and what to use instead."""

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from slurm_capture_support import capture_slurm_runs

import dagster_slurm.environment as environment
from dagster_slurm import ComputeResource, ConfigurationError, SlurmResource, SSHConnectionResource
from dagster_slurm.compute.asset_metadata import REFUSED_KEYS
from dagster_slurm.environment import EnvironmentConfig, EnvironmentHandle

OK = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"ran": True})
"""


def _compute(mode: str, **fields: Any) -> ComputeResource:
    if mode == "local":
        return ComputeResource(mode="local", **fields)
    ssh = SSHConnectionResource(host="login.invalid", user="me")
    return ComputeResource(mode="slurm", slurm=SlurmResource(ssh=ssh, remote_base="/base"),
                           **fields)


def _materialize(tmp_path: Path, compute: ComputeResource, metadata: dict[str, Any]):
    payload = tmp_path / "payload.py"
    payload.write_text(OK)

    @dg.asset(metadata=metadata)
    def thing(context: dg.AssetExecutionContext, compute: ComputeResource):
        completed = compute.run(context=context, payload_path=str(payload))
        if completed is None:  # the Slurm runner of these tests submits nothing
            yield dg.MaterializeResult()
        else:
            yield from completed.get_results()

    if compute.mode == "local":
        compute = compute.model_copy(update={"local_base_path": str(tmp_path / "base")})
    return dg.materialize([thing], resources={"compute": compute}, raise_on_error=False)


def _failure(result: Any) -> str:
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return str(failure.step_failure_data.error)


@pytest.mark.parametrize("mode", ["local", "slurm"])
@pytest.mark.parametrize("key", sorted(REFUSED_KEYS))
def test_each_refused_key_fails_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, key: str) -> None:
    calls = capture_slurm_runs(monkeypatch)
    value = ["pixi", "run", "pack-gpu"] if key == "slurm_pack_cmd" else "gpu"
    result = _materialize(tmp_path, _compute(mode), {key: value})
    assert not result.success and calls == []
    text = _failure(result)
    assert f"metadata[{key!r}]={value!r}: asset metadata of thing that this library does " \
           f"not read; {REFUSED_KEYS[key]}" in text
    assert not (tmp_path / "base").exists(), "nothing was started"


def test_the_pack_command_points_at_what_replaces_it() -> None:
    assert "metadata 'slurm_pre_deployed_env_path'" in REFUSED_KEYS["slurm_pack_cmd"]
    assert "env_packages" in REFUSED_KEYS["slurm_pack_cmd"]
    assert "payload_path='python /path/on/cluster/script.py'" in REFUSED_KEYS["slurm_payload_path"]


def test_other_metadata_is_left_alone(tmp_path: Path) -> None:
    result = _materialize(tmp_path, _compute("local"), {"slurm_team": "a", "owner": "b"})
    assert result.success


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> list[EnvironmentConfig]:
    """The environment configurations the Slurm runner's preparation asks for."""
    configs: list[EnvironmentConfig] = []

    def prepare(agent: Any, base: str, config: EnvironmentConfig, **_: Any) -> EnvironmentHandle:
        configs.append(config)
        return EnvironmentHandle(f"{config.pre_deployed_env_path}/activate.sh", None, 0, True)

    monkeypatch.setattr(environment, "prepare_environment", prepare)
    monkeypatch.setattr(SlurmResource, "agent", lambda self: "agent")
    monkeypatch.setattr(SlurmResource, "base_path", lambda self: "/base")
    return configs


class Log:
    def info(self, *args: Any, **kwargs: Any) -> None:
        pass


class Context:
    log = Log()


@pytest.mark.parametrize("resource_fields", [
    {}, {"env_packages": ["dagster-pipes"]}, {"pre_deployed_env_path": "/opt/envs/default"}])
def test_the_assets_environment_replaces_the_resources_in_asset_scope(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prepared: list[EnvironmentConfig],
        resource_fields: dict[str, Any]) -> None:
    calls = capture_slurm_runs(monkeypatch)
    compute = _compute("slurm", **resource_fields)
    assert _materialize(tmp_path, compute, {"slurm_pre_deployed_env_path": "/opt/envs/gpu/"}).success
    ((runner, _),) = calls
    assert runner.prepare_env(Context()) == "/opt/envs/gpu/activate.sh"
    (config,) = prepared
    assert (config.pre_deployed_env_path, config.env_packages) == ("/opt/envs/gpu", None)


def test_without_the_key_the_resources_environment_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prepared: list[EnvironmentConfig]) -> None:
    calls = capture_slurm_runs(monkeypatch)
    compute = _compute("slurm", pre_deployed_env_path="/opt/envs/default")
    assert _materialize(tmp_path, compute, {}).success
    ((runner, _),) = calls
    runner.prepare_env(Context())
    assert prepared[0].pre_deployed_env_path == "/opt/envs/default"


def test_a_metadata_value_object_is_read_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             prepared: list[EnvironmentConfig]) -> None:
    calls = capture_slurm_runs(monkeypatch)
    metadata = {"slurm_pre_deployed_env_path": dg.MetadataValue.path("/opt/envs/gpu")}
    assert _materialize(tmp_path, _compute("slurm"), metadata).success
    ((runner, _),) = calls
    runner.prepare_env(Context())
    assert prepared[0].pre_deployed_env_path == "/opt/envs/gpu"


def test_local_mode_checks_the_path_and_runs_here(tmp_path: Path) -> None:
    result = _materialize(tmp_path, _compute("local"), {"slurm_pre_deployed_env_path": "/opt/x"})
    assert result.success
    result = _materialize(tmp_path, _compute("local"), {"slurm_pre_deployed_env_path": "envs/x"})
    assert "metadata['slurm_pre_deployed_env_path'] of thing='envs/x': must be an absolute " \
           "path on the cluster" in _failure(result)


@pytest.mark.parametrize("mode", ["local", "slurm"])
def test_run_scope_accepts_only_the_run_allocations_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setattr(SSHConnectionResource, "get_transport",
                        lambda self: pytest.fail("the cluster was contacted"))
    compute = _compute(mode, allocation_scope="run", pre_deployed_env_path="/opt/envs/run")
    result = _materialize(tmp_path, compute, {"slurm_pre_deployed_env_path": "/opt/envs/gpu"})
    text = _failure(result)
    assert "metadata['slurm_pre_deployed_env_path']='/opt/envs/gpu': with " \
           "allocation_scope='run' every step runs in the run allocation's environment " \
           "(pre_deployed_env_path='/opt/envs/run' of the compute resource)" in text


def test_the_assets_of_one_step_must_agree(tmp_path: Path) -> None:
    payload = tmp_path / "payload.py"
    payload.write_text(OK)

    @dg.multi_asset(specs=[
        dg.AssetSpec("a", metadata={"slurm_pre_deployed_env_path": "/opt/envs/one"}),
        dg.AssetSpec("b", metadata={"slurm_pre_deployed_env_path": "/opt/envs/two"}),
    ])
    def both(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=str(payload)).get_results()

    compute = ComputeResource(mode="local", local_base_path=str(tmp_path / "base"))
    result = dg.materialize([both], resources={"compute": compute}, raise_on_error=False)
    assert "the assets of one step name different environments" in _failure(result)


def test_the_error_is_a_configuration_error(tmp_path: Path) -> None:
    @dg.asset(metadata={"slurm_environment_name": "gpu"})
    def named(context: dg.AssetExecutionContext, compute: ComputeResource) -> None:
        with pytest.raises(ConfigurationError) as caught:
            compute.run(context=context, payload_path="python -m x")
        assert (caught.value.field, caught.value.value) == ("metadata['slurm_environment_name']", "gpu")

    assert dg.materialize([named], resources={"compute": ComputeResource()}).success
