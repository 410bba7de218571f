"""Rendered Ray job scripts pinned by golden files (``UPDATE_GOLDEN=1`` rewrites them).

The files end in ``.bash`` so that the bash launcher's golden tests, which own ``*.sh`` in
the same directory, do not pick them up.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from dagster_slurm.launchers.base import ExecutionPlan
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.ray_ports import RayPortConfig
from dagster_slurm.launchers.script import load_template

GOLDEN_DIR = Path(__file__).parent / "golden"

CASES: dict[str, tuple[RayLauncher, ExecutionPlan]] = {
    "ray_local_minimal": (
        RayLauncher(),
        ExecutionPlan(
            payload=("python", "/jobs/run-1/payload.py"),
            job_dir="/jobs/run-1",
            status_file="/jobs/run-1/status",
            drain_file="/jobs/run-1/drained",
            mode="local",
        ),
    ),
    "ray_slurm_full": (
        RayLauncher(
            num_cpus_per_node=16,
            num_gpus_per_node=2,
            working_dir="ray_jobs/train_model",
            port_strategy="fixed",
            port_config=RayPortConfig(
                range_start=30000, range_end=49999, block_size=2000, lock_dir="/var/lock"
            ),
            ray_port=6380,
            dashboard_port=8266,
            network_interface="ib0",
            head_node_address="10.1.0.1",
            ray_start_args=["--log-style=record"],
            pre_start_commands=["module load cuda/12.2", 'echo "node $(hostname)"'],
            redis_password="pw",
            object_store_memory=2_000_000_000,
            include_dashboard=False,
            startup_timeout=90.5,
            temp_dir="/scratch/ray",
        ),
        ExecutionPlan(
            payload=("python", "-m", "train.entrypoint"),
            job_dir="/scratch/dg/run-7f3a/step-2",
            status_file="/scratch/dg/run-7f3a/step-2/status",
            drain_file="/scratch/dg/run-7f3a/step-2/drained",
            mode="slurm",
            num_nodes=4,
            env={"WANDB_MODE": "offline"},
            activation="/scratch/envs/prod/bin/activate",
            drain_signal="USR1",
        ),
    ),
    "ray_hostile_values": (
        RayLauncher(
            node_ip_address_command="/site/bin/ip-of \"$(hostname)\" 'x'",
            ray_start_args=["--labels=k=$(reboot)", "--log-style=$x;id|x"],
            pre_start_commands=["export X='a b'", "echo `id`"],
            working_dir='it\'s a "dir"',
            redis_password="p'w$x",
        ),
        ExecutionPlan(
            payload=("bash", "/tmp/it's/payload.sh", "$(reboot)"),
            job_dir="/tmp/it's",
            status_file="/tmp/it's/status",
            drain_file="/tmp/it's/drain",
            mode="slurm",
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_golden_file(name: str) -> None:
    launcher, plan = CASES[name]
    rendered = launcher.render(plan)
    path = GOLDEN_DIR / f"{name}.bash"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path} missing; run with UPDATE_GOLDEN=1 to create it"
    assert rendered == path.read_text()


@pytest.mark.parametrize("path", sorted(GOLDEN_DIR.glob("ray_*.bash")), ids=lambda p: p.name)
def test_golden_script_is_valid_bash(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_every_ray_golden_file_has_a_case() -> None:
    assert {path.stem for path in GOLDEN_DIR.glob("ray_*.bash")} == set(CASES)


def test_hostile_values_stay_literal_in_the_node_code() -> None:
    launcher, plan = CASES["ray_hostile_values"]
    script = launcher.render(plan)
    # Values are single-quoted words; nothing of them runs while the script is parsed.
    assert "__ds_ray_redis_password='p'\"'\"'w$x'" in script
    assert "    '$(reboot)'\n" in script


def test_rendering_is_pure_and_repeatable() -> None:
    launcher, plan = CASES["ray_slurm_full"]
    assert launcher.render(plan) == launcher.render(plan)
    assert "__ds_ray_startup_timeout=91\n" in launcher.render(plan)


def _defined(template: str) -> tuple[set[str], set[str]]:
    text = load_template(template).template
    functions = set(re.findall(r"^(__ds_ray_\w+)\(\) \{", text, re.MULTILINE))
    variables = set(re.findall(r"^(__ds_ray_\w+)=", text, re.MULTILINE))
    return functions, variables


def test_node_code_ships_every_node_function_and_setting() -> None:
    launcher_text = load_template("ray_launcher.sh").template
    shipped = launcher_text[launcher_text.index('__ds_ray_code="set -u') :]
    shipped = shipped[: shipped.index('__ds_ray_node_main \\"')]
    for template in ("ray_node.sh", "ray_ports.sh"):
        functions, variables = _defined(template)
        missing = {name for name in functions | variables if not re.search(rf"\b{name}\b", shipped)}
        assert not missing, f"{template}: not shipped to the nodes: {sorted(missing)}"
