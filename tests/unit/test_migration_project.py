"""A project written against the published dagster-slurm 1.x API loads and runs unchanged.

``migration_project/definitions.py`` uses the published names (see its README); importing it
warns once per published name, its Definitions validate, the resources carry the values in
today's fields, and its asset materializes in local mode (no cluster involved).
"""

import importlib.util
import sys
import warnings
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm import ComputeResource, SlurmSessionResource

PROJECT = Path(__file__).resolve().parent / "migration_project" / "definitions.py"

#: The published names the project uses, each with today's name its warning must give.
EXPECTED_WARNINGS = {
    "known_hosts_file": "known_hosts_path",
    "time_limit": "run_allocation.time_limit",
    "partition": "run_allocation.partition",
    "object_store_memory_gb": "object_store_memory",
    "head_startup_timeout": "startup_timeout",
    "slurm_resource": "slurm=",
}


@pytest.fixture(scope="module")
def project():
    spec = importlib.util.spec_from_file_location("migration_project_definitions", PROJECT)
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    # Only the library's own warnings: the record holds every warning of the process, and a
    # thread left by another test may warn from the standard library meanwhile.
    yield module, [w for w in caught if issubclass(w.category, DeprecationWarning)
                   and "comes from the published" in str(w.message)]
    sys.modules.pop(spec.name, None)


def test_each_published_name_warns_naming_todays_name(project) -> None:
    _, caught = project
    texts = [str(w.message) for w in caught]
    for old, new in EXPECTED_WARNINGS.items():
        assert any(f"{old}=" in text and f"use {new}" in text for text in texts), (old, texts)
    assert all(w.filename == str(PROJECT) for w in caught), "warnings point at the project's lines"


def test_definitions_validate_and_resources_hold_the_values(project) -> None:
    module, _ = project
    dg.Definitions.validate_loadable(module.defs)
    assert module.ssh.known_hosts_path == "~/.ssh/known_hosts"
    allocation = module.session.run_allocation
    assert (module.session.num_nodes, allocation.time_limit, allocation.partition) == (
        2, "01:00:00", "batch")
    launcher = module.ray_launcher
    assert (launcher.object_store_memory, launcher.startup_timeout) == (2_000_000_000, 180.0)
    (sensor,) = module.defs.sensors
    assert sensor.name == "slurm_orphan_reconcile_sensor"


def test_the_asset_materializes_in_local_mode(project, tmp_path, monkeypatch) -> None:
    module, _ = project
    monkeypatch.setenv("DAGSTER_SLURM_LOCAL_BASE", str(tmp_path / "runs"))
    result = dg.materialize([module.process_data], resources=dict(module.defs.resources))
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert (metadata["key_env"].value, metadata["foo"].value) == ("value", "bar")


def test_values_under_published_names_survive_dagsters_rebuild_of_the_resources(project) -> None:
    """Dagster rebuilds a resource from the configuration it recorded at construction; the
    values given under published names are part of it (under today's names)."""
    module, _ = project
    seen = {}

    @dg.asset
    def inspect_resources(session: SlurmSessionResource, compute_ray: ComputeResource) -> None:
        launcher = compute_ray.default_launcher
        seen.update(time_limit=session.run_allocation.time_limit,
                    partition=session.run_allocation.partition,
                    known_hosts=session.slurm.ssh.known_hosts_path,
                    startup_timeout=launcher.startup_timeout,
                    store=launcher.object_store_memory)

    resources = {k: v for k, v in module.defs.resources.items() if k in ("session", "compute_ray")}
    assert dg.materialize([inspect_resources], resources=resources).success
    assert seen == {"time_limit": "01:00:00", "partition": "batch",
                    "known_hosts": "~/.ssh/known_hosts", "startup_timeout": 180.0,
                    "store": 2_000_000_000}
