"""The published-style example of ``migration_project/published_example``: asset modules
taking ``SlurmRunConfig`` and a resources module choosing resources by
``DAGSTER_DEPLOYMENT``, changed from the published example only where docs/migration.md
says. Every deployment's definitions validate (``dagster definitions validate`` for local
mode and a run-scope one), the assets and the asset check materialize in local mode, and
each Slurm deployment builds its resources without connecting (``remote_base="$HOME/dagster_runs"`` and ``session=None`` kept as published)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import dagster as dg
import pytest

from dagster_slurm import ComputeResource, SlurmAllocationScope, SSHConnectionResource

ROOT = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).resolve().parent / "migration_project"
EXAMPLE = PROJECT / "published_example"

SLURM_DEPLOYMENTS = ["staging_docker", "staging_docker_session", "production_docker",
                     "staging_hpc", "production_hpc"]

#: What every deployment needs in the environment (the Docker ones read the user and the
#: password through dg.EnvVar, production ones the CI-deployed environment).
ENVIRONMENT = {"SLURM_EDGE_NODE_USER": "submitter", "SLURM_EDGE_NODE_PASSWORD": "submitter",
               "CI_DEPLOYED_ENVIRONMENT_PATH": "/shared/deployments/v1"}


def _load(monkeypatch: pytest.MonkeyPatch, deployment: str) -> ModuleType:
    """The example's definitions module, imported afresh for ``deployment``."""
    for name, value in {**ENVIRONMENT, "DAGSTER_DEPLOYMENT": deployment}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_REMOTE_BASE", raising=False)
    monkeypatch.syspath_prepend(str(PROJECT))
    for name in [m for m in sys.modules if m.split(".")[0] == "published_example"]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("published_example.definitions")


#: ``dagster definitions validate`` as a user runs it (5-10 s a process) for local mode and
#: for the Slurm deployment with the most resources; every Slurm deployment also goes
#: through ``Definitions.validate_loadable``, which the command calls, in
#: test_slurm_deployments_build_without_connecting.
@pytest.mark.parametrize("deployment", ["development", "staging_docker_session"])
def test_dagster_definitions_validate_passes(tmp_path: Path, deployment: str) -> None:
    env = {**os.environ, **ENVIRONMENT, "DAGSTER_DEPLOYMENT": deployment,
           "DAGSTER_HOME": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    env.pop("SLURM_REMOTE_BASE", None)
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate",
         "-d", str(PROJECT), "-m", "published_example.definitions"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "All code locations passed validation" in output


@pytest.mark.slow  # 15-20 s on two cores: six assets and a check in local mode
def test_local_mode_materializes_every_asset_and_the_check(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DAGSTER_SLURM_LOCAL_BASE", str(tmp_path / "runs"))
    defs = _load(monkeypatch, "development").defs()
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.ephemeral())
    assert result.success
    metadata = {event.asset_key.to_user_string(): event.materialization.metadata
                for event in result.get_asset_materialization_events()}
    assert set(metadata) == {"clean_events", "daily_summary", "warehouse/orders", "customers",
                             "fit_model", "score_model"}
    clean = metadata["clean_events"]
    assert (clean["chunk_rows"].value, clean["team"].value) == (500, "analytics")
    assert metadata["customers"]["label"].value == "nightly"
    assert metadata["fit_model"]["total"].value == 225
    (check,) = result.get_asset_check_evaluations()
    assert (check.check_name, check.passed) == ("orders_not_empty", True)


@pytest.fixture
def no_connection(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Hosts of any attempt to open the cluster connection (none is made)."""
    hosts: list[str] = []

    def get_transport(self: SSHConnectionResource) -> None:
        hosts.append(self.host)
        raise AssertionError("the cluster was contacted")

    monkeypatch.setattr(SSHConnectionResource, "get_transport", get_transport)
    return hosts


@pytest.mark.parametrize("deployment", SLURM_DEPLOYMENTS)
def test_slurm_deployments_build_without_connecting(
        monkeypatch: pytest.MonkeyPatch, no_connection: list[str], deployment: str) -> None:
    module = _load(monkeypatch, deployment)
    with pytest.warns(DeprecationWarning) as caught:
        defs = module.defs()
    dg.Definitions.validate_loadable(defs)
    resources = defs.resources
    assert set(resources) == {"compute", "compute_ray"}
    for key, compute in resources.items():
        assert isinstance(compute, ComputeResource) and compute.mode == "slurm"
        assert compute.slurm.remote_base == "$HOME/dagster_runs"
        run_scope = deployment.endswith("_session") and key == "compute_ray"
        assert (compute.allocation_scope is SlurmAllocationScope.RUN) == run_scope
        expected_env = "/shared/deployments/v1" if deployment.startswith("production_") else None
        assert compute.pre_deployed_env_path == expected_env
    if deployment.endswith("_session"):
        allocation = resources["compute_ray"].run_allocation
        assert (allocation.num_nodes, allocation.time_limit) == (2, "01:00:00")
    assert defs.resolve_assets_def("score_model").metadata_by_key[dg.AssetKey("score_model")][
        "slurm_pre_deployed_env_path"] == "/opt/envs/scoring"
    # Only the library's own warnings are judged: pytest.warns records every warning of the
    # process, and a thread left by another test may warn from the standard library meanwhile.
    ours = [w for w in caught if "comes from the published" in str(w.message)]
    assert any("ComputeResource(session=None)" in str(w.message) for w in ours)
    resources_file = str(EXAMPLE / "resources.py")
    assert all(w.filename == resources_file for w in ours), [
        (w.filename, str(w.message)) for w in caught]
    assert no_connection == []
