"""``compute.run`` with every context type Dagster hands to user code, in local mode.

Real runs (``dg.materialize``, ``job.execute_in_process``) with real payload scripts that
open Dagster Pipes: an asset (``AssetExecutionContext``), a multi-asset (results per asset
key), an asset check (``AssetCheckExecutionContext``; the check result the payload reports
arrives with its passed flag and severity), an op in a job (``OpExecutionContext``) and the
op of a graph-backed asset (either annotation Dagster allows there). The same five in slurm
mode, both allocation scopes: tests/integration/test_context_types.py.
"""

import textwrap
import warnings
from pathlib import Path

import dagster as dg
import pytest

from dagster_slurm import ComputeResource

MATERIALIZE = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"rows": 3})
"""

MULTI = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    for key, rows in (("left", 1), ("right", 2)):
        pipes.report_asset_materialization(asset_key=key, metadata={"rows": rows})
"""

# A check-only step targets no asset of its own: the payload names the checked asset.
CHECK = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_check(
        asset_key="numbers", check_name="no_negatives",
        passed=pipes.get_extra("passed"), severity=pipes.get_extra("severity"),
        metadata={"negatives": pipes.get_extra("negatives")},
    )
"""

OP = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.log.info("hello from the op payload")
    pipes.report_custom_message({"answer": 42})
"""


def _payload(tmp_path: Path, body: str) -> str:
    path = tmp_path / "payload.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _compute(tmp_path: Path) -> ComputeResource:
    return ComputeResource(mode="local", local_base_path=str(tmp_path / "base"))


def _materializations(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, object]]:
    """Metadata (plain values) of each materialization, by asset key."""
    return {
        event.materialization.asset_key.to_user_string(): {
            key: value.value for key, value in event.materialization.metadata.items()}
        for event in result.get_asset_materialization_events()
    }


def test_asset(tmp_path: Path) -> None:
    payload = _payload(tmp_path, MATERIALIZE)

    @dg.asset
    def numbers(context: dg.AssetExecutionContext, compute: ComputeResource):
        return compute.run(context=context, payload_path=payload).get_materialize_result()

    result = dg.materialize([numbers], resources={"compute": _compute(tmp_path)})
    (metadata,) = _materializations(result).values()
    assert metadata["rows"] == 3 and metadata["dagster_slurm/mode"] == "local"


def test_asset_with_a_check_spec_gets_both_results(tmp_path: Path) -> None:
    payload = _payload(tmp_path, """
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            pipes.report_asset_materialization(metadata={"rows": 3})
            pipes.report_asset_check(check_name="positive", passed=True)
    """)

    @dg.asset(check_specs=[dg.AssetCheckSpec("positive", asset="numbers")])
    def numbers(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    result = dg.materialize([numbers], resources={"compute": _compute(tmp_path)})
    assert list(_materializations(result)) == ["numbers"]
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "positive" and evaluation.passed


def test_asset_hands_dagster_no_deprecated_context_attribute(tmp_path: Path) -> None:
    """Pipes reads the step from its op context, not from the deprecated aliases of an
    asset context (``AssetExecutionContext.run_id``)."""
    payload = _payload(tmp_path, MATERIALIZE)

    @dg.asset
    def numbers(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dg.materialize([numbers], resources={"compute": _compute(tmp_path)}).success
    assert not [w for w in caught if "AssetExecutionContext" in str(w.message)]


def test_multi_asset_reports_per_asset_key(tmp_path: Path) -> None:
    payload = _payload(tmp_path, MULTI)

    @dg.multi_asset(specs=[dg.AssetSpec("left"), dg.AssetSpec("right")])
    def sides(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    result = dg.materialize([sides], resources={"compute": _compute(tmp_path)})
    found = _materializations(result)
    assert sorted(found) == ["left", "right"]
    assert (found["left"]["rows"], found["right"]["rows"]) == (1, 2)
    assert found["left"]["dagster_slurm/job_id"] == found["right"]["dagster_slurm/job_id"]


def test_multi_asset_subset_materializes_only_the_selected_key(tmp_path: Path) -> None:
    payload = _payload(tmp_path, """
        from dagster_pipes import open_dagster_pipes
        with open_dagster_pipes() as pipes:
            for key in pipes.asset_keys:
                pipes.report_asset_materialization(asset_key=key, metadata={"rows": 5})
    """)

    @dg.multi_asset(specs=[dg.AssetSpec("left", skippable=True),
                           dg.AssetSpec("right", skippable=True)], can_subset=True)
    def sides(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    result = dg.materialize([sides], selection=["right"], resources={"compute": _compute(tmp_path)})
    assert list(_materializations(result)) == ["right"]


@pytest.mark.parametrize(("passed", "severity"), [(False, "WARN"), (True, "ERROR")])
def test_asset_check(tmp_path: Path, passed: bool, severity: str) -> None:
    payload = _payload(tmp_path, CHECK)

    @dg.asset
    def numbers() -> list[int]:
        return [1, -2, -3]

    @dg.asset_check(asset=numbers)
    def no_negatives(context: dg.AssetCheckExecutionContext, compute: ComputeResource):
        return compute.run(
            context=context, payload_path=payload,
            extras={"passed": passed, "severity": severity, "negatives": 2},
        ).get_asset_check_result()

    result = dg.materialize([numbers, no_negatives], resources={"compute": _compute(tmp_path)})
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.asset_key == dg.AssetKey("numbers")
    assert evaluation.check_name == "no_negatives"
    assert evaluation.passed is passed
    assert evaluation.severity == dg.AssetCheckSeverity(severity)
    assert evaluation.metadata["negatives"].value == 2
    assert evaluation.metadata["dagster_slurm/mode"].value == "local"


def test_asset_check_without_annotation_yields_its_results(tmp_path: Path) -> None:
    """An unannotated ``context`` of an asset check is an AssetCheckExecutionContext too."""
    payload = _payload(tmp_path, CHECK)

    @dg.asset
    def numbers() -> list[int]:
        return [1]

    @dg.asset_check(asset=numbers)
    def no_negatives(context, compute: ComputeResource):
        assert isinstance(context, dg.AssetCheckExecutionContext)
        yield from compute.run(
            context=context, payload_path=payload,
            extras={"passed": True, "severity": "WARN", "negatives": 0},
        ).get_results()

    result = dg.materialize([numbers, no_negatives], resources={"compute": _compute(tmp_path)})
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN


def test_op_in_a_job(tmp_path: Path) -> None:
    payload = _payload(tmp_path, OP)

    @dg.op
    def ask(context: dg.OpExecutionContext, compute: ComputeResource) -> list:
        return list(compute.run(context=context, payload_path=payload).get_custom_messages())

    @dg.job
    def asking():
        ask()

    instance = dg.DagsterInstance.ephemeral()
    result = asking.execute_in_process(resources={"compute": _compute(tmp_path)},
                                       instance=instance)
    assert result.success
    assert result.output_for_node("ask") == [{"answer": 42}]
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert "hello from the op payload" in logs
    assert not result.get_asset_materialization_events()


def _graph_op(annotation: type, payload: str) -> dg.OpDefinition:
    """An op whose ``context`` is annotated with ``annotation`` and that yields the results
    of running ``payload``."""
    if annotation is dg.AssetExecutionContext:
        def build(context: dg.AssetExecutionContext, compute: ComputeResource):
            assert type(context) is dg.AssetExecutionContext
            yield from compute.run(context=context, payload_path=payload).get_results()
    else:
        def build(context: dg.OpExecutionContext, compute: ComputeResource):
            assert type(context) is dg.OpExecutionContext
            yield from compute.run(context=context, payload_path=payload).get_results()
    return dg.op(name="build")(build)


@pytest.mark.parametrize("annotation", [dg.OpExecutionContext, dg.AssetExecutionContext])
def test_op_of_a_graph_backed_asset(tmp_path: Path, annotation: type) -> None:
    """The op that calls ``run`` yields the Pipes results: they materialize the graph's
    asset (Dagster holds every op of an asset to typed results once Pipes is open)."""
    build = _graph_op(annotation, _payload(tmp_path, MATERIALIZE))

    @dg.graph_asset
    def built():
        return build()

    result = dg.materialize([built], resources={"compute": _compute(tmp_path)})
    assert result.success
    found = _materializations(result)
    assert list(found) == ["built"]
    assert found["built"]["rows"] == 3


def test_earlier_op_of_a_graph_backed_asset_passes_a_value_on(tmp_path: Path) -> None:
    """An op before the asset's last op yields an Output for the next op."""
    payload = _payload(tmp_path, OP)

    @dg.op
    def ask(context: dg.OpExecutionContext, compute: ComputeResource):
        (message,) = compute.run(context=context, payload_path=payload).get_custom_messages()
        yield dg.Output(message["answer"])

    @dg.op
    def double(answer: int) -> int:
        return 2 * answer

    @dg.graph_asset
    def doubled():
        return double(ask())

    result = dg.materialize([doubled], resources={"compute": _compute(tmp_path)})
    assert result.success
    assert result.output_for_node("doubled") == 84
