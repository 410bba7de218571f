"""RayLauncher and RayPortConfig: what is accepted, and the errors for what is not."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dagster_slurm.launchers.base import ComputeLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.ray_limits import TEMP_DIR_MAX
from dagster_slurm.launchers.ray_ports import MIN_BLOCK_SIZE, RayPortConfig


def test_defaults_match_the_documented_behaviour() -> None:
    launcher = RayLauncher()
    assert isinstance(launcher, ComputeLauncher)
    assert launcher.port_strategy == "random"
    assert launcher.num_cpus_per_node is None
    assert launcher.num_gpus_per_node == 0
    assert launcher.include_dashboard is True
    assert launcher.startup_timeout == 120
    config = launcher.port_config
    assert (config.range_start, config.range_end, config.block_size, config.lock_dir) == (
        10000,
        29999,
        1000,
        "/tmp",
    )
    assert config.block_count == 20


def test_port_config_accepts_a_dict_and_a_model() -> None:
    from_dict = RayLauncher(
        port_config={"range_start": 30000, "range_end": 49999, "block_size": 2000}
    )
    from_model = RayLauncher(
        port_config=RayPortConfig(range_start=30000, range_end=49999, block_size=2000)
    )
    assert from_dict.port_config == from_model.port_config
    assert from_dict.port_config.block_count == 10


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"range_start": 80}, "port_config.range_start=80"),
        ({"range_end": 70000}, "port_config.range_end=70000"),
        ({"range_start": 20000, "range_end": 20000}, "must be below range_end=20000"),
        ({"range_start": 20000, "range_end": 19000}, "port_config.range_start=20000"),
        ({"block_size": 8}, f"use at least {MIN_BLOCK_SIZE}"),
        ({"range_start": 10000, "range_end": 10499, "block_size": 1000}, "larger than the range"),
        ({"lock_dir": "relative/dir"}, "port_config.lock_dir='relative/dir'"),
        ({"lock_dir": "/tmp/a\nb"}, "control characters"),
    ],
)
def test_port_config_errors_name_field_and_value(values: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        RayPortConfig(**values)
    assert fragment in str(info.value)


def test_port_config_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="blocksize"):
        RayPortConfig(blocksize=100)


def test_launcher_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="num_gpus"):
        RayLauncher(num_gpus=2)


def test_smallest_block_is_accepted() -> None:
    config = RayPortConfig(
        range_start=20000, range_end=20000 + MIN_BLOCK_SIZE - 1, block_size=MIN_BLOCK_SIZE
    )
    assert config.block_count == 1


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"num_cpus_per_node": 0}, "num_cpus_per_node=0"),
        ({"num_gpus_per_node": -1}, "num_gpus_per_node=-1"),
        ({"ray_port": 80}, "ray_port=80"),
        ({"dashboard_port": 70000}, "dashboard_port=70000"),
        ({"ray_port": 40000, "dashboard_port": 40000}, "same as ray_port"),
        ({"network_interface": "eth0; reboot"}, "not a network interface name"),
        ({"head_node_address": "a b"}, "head_node_address='a b'"),
        ({"node_ip_address_command": "  "}, "node_ip_address_command"),
        ({"working_dir": "a\nb"}, "working_dir="),
        ({"ray_start_args": ["--x", "a\0b"]}, "ray_start_args[1]"),
        ({"pre_start_commands": ["ok", "bad\0"]}, "pre_start_commands[1]"),
        ({"object_store_memory": 1000}, "object_store_memory=1000"),
        ({"startup_timeout": 0}, "startup_timeout=0"),
        ({"startup_timeout": float("inf")}, "startup_timeout=inf"),
        ({"temp_dir": "relative"}, "temp_dir='relative'"),
        ({"port_strategy": "sequential"}, "port_strategy"),
    ],
)
def test_launcher_errors_name_field_and_value(values: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        RayLauncher(**values)
    assert fragment in str(info.value)


def test_temp_dir_too_long_for_unix_sockets_is_refused() -> None:
    longest = "/tmp/" + "r" * (TEMP_DIR_MAX - len("/tmp/"))
    assert RayLauncher(temp_dir=longest).temp_dir == longest
    with pytest.raises(ValidationError) as info:
        RayLauncher(temp_dir=longest + "x")
    message = str(info.value)
    assert f"{TEMP_DIR_MAX + 1} bytes is too long" in message
    assert "Unix sockets" in message


def test_temp_dir_trailing_slash_is_dropped() -> None:
    assert RayLauncher(temp_dir="/tmp/ray-x/").temp_dir == "/tmp/ray-x"


def test_fixed_ports_must_not_collide_with_the_heads_block() -> None:
    with pytest.raises(ValidationError, match="collides with another port"):
        RayLauncher(port_strategy="fixed", ray_port=10001)
    with pytest.raises(ValidationError, match="dashboard_port=10000"):
        RayLauncher(port_strategy="fixed", dashboard_port=10000)
    ok = RayLauncher(port_strategy="fixed", ray_port=6379, dashboard_port=8265)
    assert (ok.ray_port, ok.dashboard_port) == (6379, 8265)
    # Their own places in the block are fine too.
    RayLauncher(port_strategy="fixed", ray_port=10000, dashboard_port=10003)


def test_same_ray_and_dashboard_port_is_fine_without_a_dashboard() -> None:
    RayLauncher(ray_port=40000, dashboard_port=40000, include_dashboard=False)
