"""The example project (examples/dagster_slurm_example): the README's first command
materializes it in local mode and prints only what a user needs; its definitions load with
the assets this machine can run; each optional asset it leaves out comes with a reason; in
Slurm mode only the Ray resource moves to run scope."""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm.pipes.quiet import NO_MESSAGES_WARNING

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: A warning raised from a file of this repository (the library or the examples), as Python
#: prints it: "<path>:<line>: <Category>Warning: <message>".
OWN_WARNING = re.compile(
    rf"^{re.escape(str(ROOT))}/(src|examples)/\S+:\d+: \w*Warning: ", re.MULTILINE
)


@pytest.fixture
def example(monkeypatch):
    """The example's modules, imported afresh in local mode with default settings."""
    for name in ("DAGSTER_SLURM_MODE", "SLURM_ALLOCATION_SCOPE", "DAGSTER_SLURM_ENV_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    for name in [m for m in sys.modules if m.startswith("dagster_slurm_example")]:
        monkeypatch.delitem(sys.modules, name)
    definitions = importlib.import_module("dagster_slurm_example.definitions")
    availability = importlib.import_module("dagster_slurm_example.availability")
    return definitions, availability


@pytest.mark.slow  # 20-45 s on two cores: the example materializes every asset in local mode
def test_example_project_runs_locally_and_quietly(tmp_path, example):
    definitions, availability = example
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(EXAMPLES)]),
        "DAGSTER_SLURM_MODE": "local",
        "DAGSTER_HOME": str(tmp_path),
        "DAGSTER_SLURM_LOCAL_BASE": str(tmp_path / "runs"),
        # show every deprecation and user warning, so that none from our own files hides
        "PYTHONWARNINGS": "always::DeprecationWarning,always::UserWarning",
    }
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "run_example.py")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run succeeded" in proc.stdout
    assert "check squares_are_positive: passed" in proc.stdout
    assert "materialized squares" in proc.stdout
    assert "materialized shell_report" in proc.stdout
    assert "report from" in output, "the shell payload's output reaches the compute logs"
    assert NO_MESSAGES_WARNING not in output
    assert "expected_writer_count" not in output
    assert not OWN_WARNING.findall(output), OWN_WARNING.findall(output)
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped:")]
    if definitions.SKIPPED:
        assert skipped == [availability.skipped_line(definitions.SKIPPED)]
    else:
        assert skipped == []
    for item in definitions.SKIPPED:
        assert f"materialized {item.asset}" not in proc.stdout


def test_definitions_load_with_the_assets_that_can_run_here(example):
    definitions, _ = example
    dg.Definitions.validate_loadable(definitions.defs)
    keys = {key.to_user_string() for key in definitions.defs.resolve_asset_graph().get_all_asset_keys()}
    left_out = {item.asset for item in definitions.SKIPPED}
    assert keys == {"shell_report", "squares", "ray_sum", "spark_sum"} - left_out
    assert ("ray_sum" in left_out) == (definitions.RAY_MISSING is not None)
    assert ("spark_sum" in left_out) == (definitions.SPARK_MISSING is not None)
    assert set(definitions.RESOURCES) == {"compute", "compute_ray", "compute_spark"}


def test_each_optional_asset_is_skipped_with_a_reason(example):
    _, availability = example
    nothing = lambda name: None  # noqa: E731  (find_spec / which that find nothing)
    found = lambda name: object()  # noqa: E731
    java = lambda name: "/usr/bin/java" if name == "java" else None  # noqa: E731
    assert availability.ray_missing(nothing) == (
        "ray is not installed (pip install 'dagster-slurm[ray]')")
    assert availability.ray_missing(found) is None
    assert availability.spark_missing(None, found, java, {}) == (
        "this dagster-slurm has no SparkLauncher")
    assert availability.spark_missing(object, nothing, java, {}) == (
        "pyspark is not installed (pip install pyspark)")
    assert "no Java runtime" in availability.spark_missing(object, found, nothing, {})
    assert availability.spark_missing(object, found, java, {}) is None
    line = availability.skipped_line([availability.Skipped("ray_sum", "ray is not installed"),
                                      availability.Skipped("spark_sum", "no Java runtime")])
    assert line == "skipped: ray_sum (ray is not installed); spark_sum (no Java runtime)"
    assert availability.skipped_line([]) == ""


def test_java_home_counts_as_a_java_runtime(example, tmp_path):
    _, availability = example
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("")
    assert availability.java_missing(lambda name: None, {"JAVA_HOME": str(tmp_path)}) is None
    assert availability.java_missing(lambda name: None, {"JAVA_HOME": "/nowhere"}) is not None


def test_run_scope_moves_only_the_ray_resource(example, monkeypatch, tmp_path):
    definitions, _ = example
    key = tmp_path / "id"
    key.write_text("not a real key\n")
    for name, value in {"DAGSTER_SLURM_MODE": "slurm", "SLURM_ALLOCATION_SCOPE": "run",
                        "SLURM_EDGE_NODE_HOST": "login.invalid", "SLURM_EDGE_NODE_USER": "me",
                        "SLURM_EDGE_NODE_KEY_PATH": str(key),
                        "DAGSTER_SLURM_ENV_PATH": "/shared/env"}.items():
        monkeypatch.setenv(name, value)
    resources = definitions.compute_resources()
    scopes = {name: resource.allocation_scope for name, resource in resources.items()}
    assert scopes == {"compute": "asset", "compute_ray": "run", "compute_spark": "asset"}
    monkeypatch.setenv("SLURM_ALLOCATION_SCOPE", "asset")
    assert {r.allocation_scope for r in definitions.compute_resources().values()} == {"asset"}
