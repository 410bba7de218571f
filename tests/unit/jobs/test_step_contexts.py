"""jobs/contexts.py: what each context type Dagster hands to user code becomes, read inside
real runs, and the error for anything that is not such a context."""

from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from dagster_slurm import ComputeResource
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.contexts import op_context, run_id_of, step_identity


def _seen(context, seen: dict, name: str) -> None:
    """Record what the helpers make of ``context`` under ``name``."""
    op = op_context(context)
    seen[name] = {
        "given": type(context),
        "op": type(op),
        "unwrapped": op is getattr(context, "op_execution_context", context),
        "identity": step_identity(context),
        "step": op.get_step_execution_context().step.key,
        "run_id": run_id_of(context),
    }


def _assets_and_check(seen: dict) -> list:
    @dg.asset
    def numbers(context: dg.AssetExecutionContext):
        _seen(context, seen, "asset")
        return 1

    @dg.multi_asset(specs=[dg.AssetSpec("left"), dg.AssetSpec("right")])
    def sides(context: dg.AssetExecutionContext):
        _seen(context, seen, "multi_asset")
        yield dg.MaterializeResult(asset_key="left")
        yield dg.MaterializeResult(asset_key="right")

    @dg.asset_check(asset=numbers)
    def positive(context: dg.AssetCheckExecutionContext):
        _seen(context, seen, "asset_check")
        return dg.AssetCheckResult(passed=True)

    @dg.op
    def inner(context: dg.OpExecutionContext):
        _seen(context, seen, "graph_op")
        return 1

    @dg.graph_asset
    def graphed():
        return inner()

    return [numbers, sides, positive, graphed]


def test_every_context_type_becomes_its_op_context() -> None:
    seen: dict = {}
    result = dg.materialize(_assets_and_check(seen))
    assert result.success

    @dg.op
    def plain(context: dg.OpExecutionContext):
        _seen(context, seen, "op")

    @dg.job
    def plain_job():
        plain()

    job_result = plain_job.execute_in_process()
    assert job_result.success

    assert {name: entry["given"] for name, entry in seen.items()} == {
        "asset": dg.AssetExecutionContext,
        "multi_asset": dg.AssetExecutionContext,
        "asset_check": dg.AssetCheckExecutionContext,
        "graph_op": dg.OpExecutionContext,
        "op": dg.OpExecutionContext,
    }
    for name, entry in seen.items():
        assert entry["op"] is dg.OpExecutionContext, name
        assert entry["unwrapped"], name
        run_id = job_result.run_id if name == "op" else result.run_id
        assert entry["identity"] == (run_id, entry["step"]), name
        assert entry["run_id"] == run_id, name
    assert seen["asset_check"]["step"] == "numbers_positive"
    assert seen["graph_op"]["step"] == "graphed.inner"


@pytest.mark.parametrize("context", [None, SimpleNamespace(log=None),
                                     dg.build_init_resource_context()])
def test_anything_else_is_refused_naming_its_type(context) -> None:
    with pytest.raises(ConfigurationError) as caught:
        op_context(context)
    assert caught.value.field == "context"
    assert type(context).__name__ in str(caught.value)
    assert "AssetCheckExecutionContext" in str(caught.value)


def test_run_refuses_a_wrong_context_before_anything_starts(tmp_path: Path) -> None:
    base = tmp_path / "base"
    compute = ComputeResource(mode="local", local_base_path=str(base))
    payload = tmp_path / "payload.py"
    payload.write_text("raise SystemExit(3)\n")
    with pytest.raises(ConfigurationError, match="context=.*must be the context Dagster passes"):
        compute.run(context=None, payload_path=str(payload))
    assert not base.exists()
