"""Local mode with a real Ray: one node starts, the payload connects, nothing is left over.

Needs ``ray[default]`` in the test environment (skipped otherwise). Each test starts one
Ray head (about 1 GB of memory with the dashboard, less without), so they run one at a time.
"""

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.ray import RayLauncher

BIN = os.path.dirname(sys.executable)
RAY = os.path.join(BIN, "ray")

pytestmark = [
    pytest.mark.slow,
    # CI installs the ray extra (scripts/test.sh): there a missing ray must fail, not skip.
    pytest.mark.skipif(
        not os.access(RAY, os.X_OK) and os.environ.get("CI") != "true",
        reason="ray[default] is not installed here",
    ),
]

PROBE = """\
import os, ray
ray.init(address="auto", logging_level="ERROR")
alive = [node for node in ray.nodes() if node["Alive"]]
@ray.remote
def square(x):
    return x * x
print("nodes", len(alive), "address", os.environ["RAY_ADDRESS"], "sum", sum(ray.get([square.remote(i) for i in range(4)])))
"""

PIPES_PAYLOAD = """\
import ray
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR")
    alive = [node for node in ray.nodes() if node["Alive"]]
    cpus = ray.cluster_resources().get("CPU")
    pipes.log.info(f"ray nodes: {len(alive)}")
    pipes.report_asset_materialization(metadata={"ray_nodes": len(alive), "ray_cpus": cpus})
"""


def _processes_using(text: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True, check=False)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def _wait_gone(text: str, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    left = _processes_using(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _processes_using(text)
    return left


@pytest.fixture
def temp_dir():
    path = f"/tmp/dsr-t-{uuid.uuid4().hex[:8]}"
    yield path
    subprocess.run(["pkill", "-KILL", "-f", path], check=False)
    subprocess.run(["rm", "-rf", path], check=False)


def test_script_starts_local_ray_and_stops_it(tmp_path: Path, temp_dir: str) -> None:
    job = tmp_path / "job"
    job.mkdir()
    plan = ExecutionPlan(
        payload=(sys.executable, "-c", PROBE),
        job_dir=str(job),
        status_file=str(job / "status"),
        drain_file=str(job / "drained"),
        pid_file=str(job / "payload.pid"),
        mode="local",
    )
    launcher = RayLauncher(
        num_cpus_per_node=2,
        object_store_memory=100_000_000,
        include_dashboard=False,
        temp_dir=temp_dir,
    )
    script = tmp_path / "job.sh"
    script.write_text(launcher.render(plan))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        start_new_session=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "nodes 1 address 127.0.0.1:" in result.stdout
    assert "sum 14" in result.stdout
    assert "all 1 Ray node(s) joined" in result.stderr
    assert _wait_gone(temp_dir) == [], "Ray processes survived the job"


def test_materialize_in_local_mode_sees_the_ray_cluster(
    tmp_path: Path, temp_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    payload = tmp_path / "ray_payload.py"
    payload.write_text(textwrap.dedent(PIPES_PAYLOAD))
    compute = ComputeResource(
        mode="local",
        local_base_path=str(tmp_path / "base"),
        default_launcher=RayLauncher(
            num_cpus_per_node=2, object_store_memory=100_000_000, temp_dir=temp_dir
        ),
    )

    @dg.asset
    def ray_asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=str(payload)).get_results()

    result = dg.materialize([ray_asset], resources={"compute": compute})
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["ray_nodes"].value == 1
    assert metadata["ray_cpus"].value == 2.0
    assert _wait_gone(temp_dir) == [], "Ray processes survived the asset"
