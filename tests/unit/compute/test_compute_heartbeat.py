"""ComputeResource.heartbeat_timeout: the asset-scope jobs' dead-man's switch limit."""

from __future__ import annotations

import pytest

from dagster_slurm import ComputeResource, SlurmRunAllocationConfig


def test_default_is_on_with_600_seconds() -> None:
    assert ComputeResource().heartbeat_timeout == 600.0


def test_none_disables_it_and_120_is_the_floor() -> None:
    assert ComputeResource(heartbeat_timeout=None).heartbeat_timeout is None
    assert ComputeResource(heartbeat_timeout=120).heartbeat_timeout == 120
    with pytest.raises(Exception, match="heartbeat_timeout") as info:
        ComputeResource(heartbeat_timeout=30)
    assert "at least 120 seconds" in str(info.value)
    assert "allow_short_heartbeat_timeout" in str(info.value)


def test_short_limits_need_the_escape_hatch_and_never_go_below_5() -> None:
    assert ComputeResource(heartbeat_timeout=8, allow_short_heartbeat_timeout=True
                           ).heartbeat_timeout == 8
    with pytest.raises(Exception, match="at least 5 seconds"):
        ComputeResource(heartbeat_timeout=2, allow_short_heartbeat_timeout=True)


def test_run_scope_points_to_the_run_allocations_own_limit() -> None:
    with pytest.raises(Exception, match="run_allocation=SlurmRunAllocationConfig"):
        ComputeResource(allocation_scope="run", heartbeat_timeout=300)
    # the default is not a choice of the user: run scope without the field is fine
    resource = ComputeResource(allocation_scope="run",
                               run_allocation=SlurmRunAllocationConfig(heartbeat_timeout=300))
    assert resource.run_allocation is not None
