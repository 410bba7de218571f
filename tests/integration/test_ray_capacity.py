"""The Ray capacity helpers against a real Ray 2.60 runtime on 127.0.0.1 (no Slurm).

A local Ray with four units of a custom resource ``lane``: a co-tenant (one actor) holds
two, the primary's pool the other two. The co-tenant fails (its actor is killed) after the
watcher saw the cluster full; the reserve must then start, while the primary still runs,
with the stable snapshot of the two released lanes, and place its actors on them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_slurm.ray import run_with_ray_reserve_topup, wait_for_stable_ray_resources

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.integration]

DEADLINE = 20.0  # seconds any wait on Ray or on another thread may take before the test fails
LANES = 4
NEED = {"lane": 1, "CPU": 0.5}


#: Environment of the local Ray: not the cluster a RAY_ADDRESS names; no usage report;
#: token authentication off, since a new local ray.init() otherwise writes a token to
#: ~/.ray/auth_token, which every later `ray start` of this user picks up.
RAY_ENVIRONMENT = {"RAY_ADDRESS": None, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in RAY_ENVIRONMENT}
    token = Path.home() / ".ray" / "auth_token"
    token_existed = token.exists()
    for name, value in RAY_ENVIRONMENT.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    temp_dir = tempfile.mkdtemp(prefix="dsrcap-", dir="/tmp")  # short: socket paths <= 107 bytes
    try:
        ray.init(num_cpus=LANES, num_gpus=0, resources={"lane": LANES}, include_dashboard=False,
                 _node_ip_address="127.0.0.1", object_store_memory=100 * 1024 * 1024,
                 _temp_dir=temp_dir, log_to_driver=False, logging_level="ERROR")
        yield
    finally:
        ray.shutdown()
        for name, value in saved.items():  # ray.init may have set some of them itself
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert token_existed or not token.exists(), f"the local Ray wrote {token}"


@ray.remote(num_cpus=0.5, resources={"lane": 1})
class Lane:
    """One unit of work capacity: an actor holding a lane and half a CPU."""

    def ident(self) -> str:
        return ray.get_runtime_context().get_actor_id()

    def square(self, value: int) -> tuple[str, int]:
        return self.ident(), value * value


@ray.remote(num_cpus=1, resources={"lane": 2})
class CoTenant:
    """Another user's job holding lanes and one CPU in one actor, released at once."""

    def ready(self) -> bool:
        return True


def settle() -> None:
    """Wait until the actors of an earlier test released everything (Ray frees a killed
    actor's resources asynchronously)."""
    give_up = time.monotonic() + DEADLINE
    while ray.available_resources().get("lane", 0.0) != LANES:
        assert time.monotonic() < give_up, f"lanes still taken: {ray.available_resources()}"
        time.sleep(0.1)


def start_lanes(count: int) -> list:
    actors = [Lane.remote() for _ in range(count)]
    ray.get([actor.ident.remote() for actor in actors], timeout=DEADLINE)
    return actors


def process(actors: list, values: list[int]) -> tuple[set[str], list[int]]:
    answers = ray.get([actors[i % len(actors)].square.remote(v) for i, v in enumerate(values)],
                      timeout=DEADLINE)
    return {who for who, _ in answers}, [square for _, square in answers]


class Recording:
    """``ray.available_resources`` that keeps every snapshot and signals the first one."""

    def __init__(self) -> None:
        self.snapshots: list[dict[str, float]] = []
        self.first = threading.Event()

    def __call__(self) -> dict[str, float]:
        snapshot = dict(ray.available_resources())
        self.snapshots.append(snapshot)
        self.first.set()
        return snapshot


def test_the_reserve_runs_on_capacity_a_failed_co_tenant_released(local_ray: None) -> None:
    settle()
    cotenant = CoTenant.remote()
    ray.get(cotenant.ready.remote(), timeout=DEADLINE)
    pool = start_lanes(2)  # the primary's fair share, placed before the watch starts
    provider = Recording()
    reserve_started = threading.Event()
    given: list[dict[str, float]] = []

    def cotenant_fails() -> None:
        if provider.first.wait(DEADLINE):
            ray.kill(cotenant)

    def primary() -> tuple[bool, set[str], list[int]]:
        overlapped = reserve_started.wait(DEADLINE)
        return (overlapped, *process(pool, [1, 2, 3, 4]))

    def reserve(available: dict[str, float]) -> tuple[set[str], list[int]]:
        given.append(available)
        reserve_started.set()
        actors = start_lanes(min(4, int(available["lane"])))
        try:
            return process(actors, [5, 6, 7, 8])
        finally:
            for actor in actors:
                ray.kill(actor)

    killer = threading.Thread(target=cotenant_fails, daemon=True)
    killer.start()
    try:
        primary_result, reserve_result = run_with_ray_reserve_topup(
            primary, reserve, NEED, stable_polls=2, poll_interval_seconds=0.25,
            timeout_seconds=DEADLINE, resources=provider)
    finally:
        killer.join(DEADLINE)
        for actor in pool:
            ray.kill(actor)

    assert provider.snapshots[0].get("lane", 0.0) == 0.0, "the cluster was not full at first"
    assert primary_result == (True, primary_result[1], [1, 4, 9, 16])
    assert len(primary_result[1]) == 2
    assert given and given[0]["lane"] == 2.0 and given[0]["CPU"] == 3.0
    assert [s.get("lane") for s in provider.snapshots[-2:]] == [2.0, 2.0]
    assert reserve_result is not None
    reserve_actors, reserve_squares = reserve_result
    assert reserve_squares == [25, 36, 49, 64]
    assert len(reserve_actors) == 2 and not reserve_actors & primary_result[1]


def test_no_released_capacity_means_no_reserve_after_the_timeout(local_ray: None) -> None:
    settle()
    everything = CoTenant.options(resources={"lane": LANES}).remote()
    ray.get(everything.ready.remote(), timeout=DEADLINE)
    try:
        result = run_with_ray_reserve_topup(
            lambda: "primary", lambda _: pytest.fail("the reserve started"), NEED,
            stable_polls=2, poll_interval_seconds=0.25, timeout_seconds=1.5)
    finally:
        ray.kill(everything)
    assert result == ("primary", None)


def test_the_default_provider_reads_the_connected_cluster(local_ray: None) -> None:
    settle()
    holders = start_lanes(1)
    try:
        snapshot = wait_for_stable_ray_resources(NEED, stable_polls=2, poll_interval_seconds=0.25,
                                                 timeout_seconds=DEADLINE)
    finally:
        for actor in holders:
            ray.kill(actor)
    assert snapshot is not None
    assert snapshot["lane"] == LANES - 1 and snapshot["CPU"] == LANES - 0.5
