"""The published package's compute.run / run_hetjob keywords and Pipes client names.

Each published keyword either works or fails, before anything starts, with an error that
names what to use instead (never Python's bare TypeError for a keyword it does not know).
"""

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dagster as dg
import pytest

from dagster_slurm import (
    BashLauncher,
    ComputePipesClient,
    ComputeResource,
    LocalPipesClient,
    SlurmMetric,
    SlurmPipesClient,
    SlurmResource,
    SSHConnectionResource,
)
from dagster_slurm.compute.published_run import REFUSED_KEYWORDS, published_run
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.published_metadata import ALL_METRICS

PAYLOAD = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"rows": 3})
"""

#: A value of each refused keyword that asks for something, and a word of its advice.
ASKING: dict[str, tuple[object, str]] = {
    "resource_requirements": ({"cpus": 8, "framework": "ray"}, "allocation_scope='run'"),
    "force_env_push": (True, "hash of their content"),
    "environment_name": ("gpu", "pre_deployed_env_path"),
    "extra_files": (["helpers.py"], "shared filesystem"),
    "metrics_collector": (lambda metrics: {}, "published_metadata_keys=True"),
    "poll_timeout": (7200, "time_limit"),
    "use_session": (True, "allocation_scope='run'"),
    "pack_cmd_override": (["pixi", "run", "pack"], "env_packages"),
    "pre_deployed_env_path_override": ("/envs/other", "pre_deployed_env_path=..."),
    "python_executable": ("/usr/bin/python3.12", "payload_path='/path/to/python script.py'"),
}


def _call(mode: str = "slurm", payload: str = "train.py", env: str | None = None,
          keys: bool = False, **arguments: Any):
    return published_run(arguments, mode=mode, payload_path=payload,
                         pre_deployed_env_path=env, published_metadata_keys=keys)


def test_every_refused_keyword_has_a_case() -> None:
    assert set(ASKING) == set(REFUSED_KEYWORDS)


@pytest.mark.parametrize("name", sorted(ASKING))
def test_a_keyword_without_equivalent_names_the_replacement(name: str) -> None:
    value, advice = ASKING[name]
    with pytest.raises(ConfigurationError) as caught:
        _call(**{name: value})
    assert caught.value.field == name and "not supported here" in str(caught.value)
    assert advice in str(caught.value)


@pytest.mark.parametrize("value", [None, False, {}, []])
def test_a_keyword_that_asks_for_nothing_is_accepted(value: object) -> None:
    names = [n for n in REFUSED_KEYWORDS if value is None or n != "poll_timeout"]
    call = _call(**dict.fromkeys(names, value))
    assert call.payload_path == "train.py" and call.published_metrics is None


def test_an_unknown_keyword_is_a_type_error_with_the_closest_name() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'extra_evn'; did you mean 'extra_env'"):
        _call(extra_evn={"A": "1"})


def test_a_skipped_upload_runs_the_script_on_the_cluster() -> None:
    assert _call(skip_payload_upload=True, remote_payload_path="/opt/jobs/train v2.py"
                 ).payload_path == "python '/opt/jobs/train v2.py'"
    assert _call(skip_payload_upload=True, remote_payload_path="/opt/jobs/prep.sh"
                 ).payload_path == "bash /opt/jobs/prep.sh"
    derived = _call(payload="jobs/train.py", env="/envs/prod", skip_payload_upload=True)
    assert derived.payload_path == "python /envs/prod/scripts/train.py"
    # local mode runs the local file, as the published package's local client did
    assert _call(mode="local", skip_payload_upload=True,
                 remote_payload_path="/opt/x.py").payload_path == "train.py"


def test_a_skipped_upload_needs_to_know_where_the_script_is() -> None:
    with pytest.raises(ConfigurationError, match="needs remote_payload_path"):
        _call(skip_payload_upload=True)
    with pytest.raises(ConfigurationError, match="only with skip_payload_upload=True"):
        _call(remote_payload_path="/opt/x.py")
    with pytest.raises(ConfigurationError, match="absolute path on the cluster"):
        _call(skip_payload_upload=True, remote_payload_path="x.py")


def test_a_run_config_counts_as_its_keywords() -> None:
    config = SimpleNamespace(force_env_push=False, skip_payload_upload=True,
                             remote_payload_path="/opt/a.py", environment_name=None,
                             extra_files=None)
    assert _call(config=config).payload_path == "python /opt/a.py"
    assert _call(config=config, remote_payload_path="/opt/b.py").payload_path == "python /opt/b.py"
    with pytest.raises(ConfigurationError, match="environment_name"):
        _call(config=SimpleNamespace(**{**vars(config), "environment_name": "gpu"}))
    with pytest.raises(ConfigurationError, match="must be a SlurmRunConfig"):
        _call(config={"skip_payload_upload": True})


def test_slurm_metrics_and_the_resource_option_select_published_keys() -> None:
    assert _call().published_metrics is None
    assert _call(keys=True).published_metrics == ALL_METRICS
    chosen = _call(slurm_metrics=[SlurmMetric.NODE_HOURS, "max_memory_mb"]).published_metrics
    assert chosen == {SlurmMetric.NODE_HOURS, SlurmMetric.MAX_MEMORY}
    assert _call(keys=True, slurm_metrics=[]).published_metrics == frozenset()
    with pytest.raises(ConfigurationError, match="unknown metric 'gpus'"):
        _call(slurm_metrics=["gpus"])


def test_the_resource_option_reaches_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    class Runner:
        def run(self, context: Any, request: Any) -> str:
            seen.append(request)
            return "done"

    monkeypatch.setattr(ComputeResource, "_runner",
                        lambda self, session, env_path=None: Runner())
    results: list[Any] = []

    @dg.asset
    def calls(context: dg.AssetExecutionContext) -> None:
        results.append(ComputeResource(published_metadata_keys=True).run(context, "true"))
        results.append(ComputeResource().run(context, "true", slurm_metrics={"node_hours"}))
        results.append(ComputeResource().run(context, "true"))

    dg.materialize([calls])
    assert results == ["done"] * 3
    assert [r.published_metrics for r in seen] == [ALL_METRICS, {SlurmMetric.NODE_HOURS}, None]


def _asset(payload: Path, call):
    @dg.asset
    def thing(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from call(context, compute, str(payload)).get_results()

    return thing


def _materialize(tmp_path: Path, call, **resource: Any):
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent(PAYLOAD))
    compute = ComputeResource(mode="local", local_base_path=str(tmp_path / "base"), **resource)
    return dg.materialize([_asset(payload, call)], resources={"compute": compute},
                          raise_on_error=False)


def _metadata(result: Any) -> dict[str, Any]:
    (event,) = result.get_asset_materialization_events()
    return {key: value.value for key, value in event.materialization.metadata.items()}


def _failure(result: Any) -> str:
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    return failure.step_failure_data.error.cause.message


def test_published_keywords_through_a_local_run(tmp_path: Path) -> None:
    result = _materialize(tmp_path, lambda context, compute, payload: compute.run(
        context=context, payload_path=payload, resource_requirements=None, force_env_push=False,
        slurm_metrics=[SlurmMetric.CPU_EFFICIENCY]), published_metadata_keys=True)
    assert result.success
    meta = _metadata(result)
    assert meta["rows"] == 3 and meta["dagster_slurm/mode"] == "local"
    assert "cpu_efficiency_pct" not in meta and "slurm_job_id" not in meta  # slurm mode only


def test_a_refused_keyword_fails_the_step_before_it_starts(tmp_path: Path) -> None:
    result = _materialize(tmp_path, lambda context, compute, payload: compute.run(
        context=context, payload_path=payload, poll_timeout=600))
    assert not result.success and "poll_timeout=600" in _failure(result)
    assert not (tmp_path / "base").exists() or not any((tmp_path / "base").rglob("*.py"))


def test_get_pipes_client_runs_through_the_resource(tmp_path: Path) -> None:
    def call(context: Any, compute: ComputeResource, payload: str):
        client = compute.get_pipes_client(context, launcher=BashLauncher())
        assert isinstance(client, dg.PipesClient) and isinstance(client, ComputePipesClient)
        return client.run(context=context, payload_path=payload, extra_env={"X": "1"})

    result = _materialize(tmp_path, call)
    assert result.success and _metadata(result)["rows"] == 3


def test_local_pipes_client_of_the_published_package(tmp_path: Path) -> None:
    client = LocalPipesClient(launcher=BashLauncher(), base_dir=str(tmp_path / "own"),
                              require_pixi=True)
    result = _materialize(tmp_path, lambda context, compute, payload: client.run(
        context=context, payload_path=payload, extras={"day": "2026-01-01"}))
    assert result.success and _metadata(result)["dagster_slurm/mode"] == "local"
    assert (tmp_path / "own").is_dir()


def _slurm() -> SlurmResource:
    return SlurmResource(ssh=SSHConnectionResource(host="login.invalid", user="u"),
                         remote_base="/cluster/ds")


def test_slurm_pipes_client_maps_what_it_can() -> None:
    client = SlurmPipesClient(_slurm(), BashLauncher(), debug_mode=True,
                              pre_deployed_env_path="/envs/prod", auto_detect_platform=False,
                              cleanup_on_failure=True)
    assert client.defer_cleanup is True
    compute = client.compute
    assert isinstance(compute, ComputeResource) and compute.mode == "slurm"
    assert (compute.pre_deployed_env_path, compute.auto_detect_platform) == ("/envs/prod", False)


@pytest.mark.parametrize(("arguments", "field", "advice"), [
    ({"session_resource": object()}, "session_resource", "allocation_scope='run'"),
    ({"pack_platform": "linux-64"}, "pack_platform", "env_packages"),
    ({"pack_on_remote": True}, "pack_on_remote", "env_packages"),
    ({"remote_pack_timeout": 60}, "remote_pack_timeout", "env_packages"),
    ({"cache_inject_globs": ["dist/*.whl"]}, "cache_inject_globs", "env_packages"),
])
def test_slurm_pipes_client_refuses_what_has_no_equivalent(arguments, field, advice) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SlurmPipesClient(_slurm(), BashLauncher(), **arguments)
    assert caught.value.field == field and advice in str(caught.value)


def test_the_published_hetjob_form_shows_todays_form() -> None:
    compute = ComputeResource()
    triples = [("prep", "prep.py", {"nodes": 1}), ("train", "train.py", {"gpus_per_node": 2})]
    for call in (lambda: compute.run_hetjob(None, assets=triples, launchers={}),
                 lambda: compute.run_hetjob(None, triples)):
        with pytest.raises(ConfigurationError) as caught:
            call()
        text = str(caught.value)
        assert "published package's form" in text and "components=[HetJobComponent(" in text
    with pytest.raises(TypeError, match="unexpected keyword argument 'asset'"):
        compute.run_hetjob(None, asset=triples)
