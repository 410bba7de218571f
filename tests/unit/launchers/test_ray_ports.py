"""Port blocks: the pure rules, and the job script's shell functions agreeing with them."""

from __future__ import annotations

import subprocess

import pytest

from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.ray_ports import (
    FIRST_WORKER_OFFSET,
    PORT_OFFSETS,
    SCRIPT_PORT_ORDER,
    RayNodePorts,
    RayPortConfig,
    candidate_blocks,
    choose_block,
    fixed_block_base,
    fnv1a_32,
    hash_block_index,
    reserved_offsets,
)

SMALL = RayPortConfig(range_start=20000, range_end=20499, block_size=100)


def test_fnv1a_known_values() -> None:
    # Reference values of 32-bit FNV-1a.
    assert fnv1a_32("") == 0x811C9DC5
    assert fnv1a_32("a") == 0xE40C292C
    assert fnv1a_32("foobar") == 0xBF9CF968


def test_hash_block_gives_consecutive_blocks_per_job() -> None:
    first = hash_block_index("4242", 0, 20)
    assert [hash_block_index("4242", i, 20) for i in range(3)] == [
        first,
        (first + 1) % 20,
        (first + 2) % 20,
    ]
    assert hash_block_index("4242", 0, 20) == hash_block_index("4242", 0, 20)
    with pytest.raises(ValueError, match="blocks=0"):
        hash_block_index("1", 0, 0)


def test_candidate_blocks_wrap_around_from_the_first() -> None:
    assert list(candidate_blocks(3, 5)) == [3, 4, 0, 1, 2]
    assert list(candidate_blocks(0, 1)) == [0]


def test_choose_block_retries_after_collisions() -> None:
    tried: list[int] = []
    busy = {20300, 20400, 20000}

    def is_free(base: int) -> bool:
        tried.append(base)
        return base not in busy

    assert choose_block(SMALL, 3, is_free) == 20100
    assert tried == [20300, 20400, 20000, 20100]


def test_choose_block_gives_none_when_all_are_taken() -> None:
    assert choose_block(SMALL, 2, lambda base: False) is None


def test_fixed_blocks_follow_the_node_index_and_wrap() -> None:
    assert [fixed_block_base(SMALL, i) for i in range(7)] == [
        20000,
        20100,
        20200,
        20300,
        20400,
        20000,
        20100,
    ]


def test_node_ports_stay_inside_the_block_and_are_distinct() -> None:
    ports = RayNodePorts(base=20100, block_size=100)
    fixed = [ports.port(name) for name in PORT_OFFSETS]
    assert len(set(fixed)) == len(fixed)
    assert all(port in ports.all_ports() for port in fixed)
    assert ports.min_worker_port == 20100 + FIRST_WORKER_OFFSET
    assert ports.max_worker_port == 20199
    assert max(reserved_offsets()) < FIRST_WORKER_OFFSET


def test_a_partial_block_at_the_end_of_the_range_is_not_used() -> None:
    config = RayPortConfig(range_start=20000, range_end=20249, block_size=100)
    assert config.block_count == 2
    assert config.block_base(2) == 20000


def _bash(functions: str, body: str) -> str:
    script = "__ds_ray_node_log() { printf '%s\\n' \"$*\" >&2; }\n" + functions + "\n" + body
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=False, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("text", ["", "a", "4242", "local-12345", "1234567_89"])
def test_shell_hash_matches_python(text: str) -> None:
    functions = RayLauncher().port_functions()
    out = _bash(functions, f"__ds_ray_fnv1a '{text}'")
    assert int(out) == fnv1a_32(text)


def test_shell_hash_block_matches_python() -> None:
    launcher = RayLauncher(port_config=SMALL)
    body = "for i in 0 1 2 3 4 5; do __ds_ray_hash_base 987654 $i; done"
    bases = [int(line) for line in _bash(launcher.port_functions(), body).split()]
    assert bases == [SMALL.block_base(hash_block_index("987654", i, 5)) for i in range(6)]


def test_shell_port_names_match_python_offsets() -> None:
    launcher = RayLauncher(port_config=SMALL)
    body = "for name in " + " ".join(SCRIPT_PORT_ORDER) + "; do __ds_ray_port 20100 $name; done"
    ports = [int(line) for line in _bash(launcher.port_functions(), body).split()]
    node = RayNodePorts(base=20100, block_size=100)
    assert ports == [node.port(name) for name in PORT_OFFSETS] + [node.min_worker_port]


def test_shell_fixed_strategy_uses_block_of_node_index() -> None:
    launcher = RayLauncher(port_config=SMALL, port_strategy="fixed")
    body = (
        "for i in 0 1 6; do __ds_ray_choose_block $i job; "
        "printf '%s\\n' \"$__ds_ray_port_base\"; done"
    )
    bases = [int(line) for line in _bash(launcher.port_functions(), body).split()]
    assert bases == [fixed_block_base(SMALL, i) for i in (0, 1, 6)]
