"""``compute.run`` with every context type Dagster hands to user code, on the dev cluster.

The five steps of tests/unit/compute/test_local_context_types.py, in slurm mode with both
allocation scopes (one Slurm job per call; steps of a run sharing its allocation): an asset
(``AssetExecutionContext``), a multi-asset (a materialization per asset key), an asset check
(``AssetCheckExecutionContext``; the check result arrives with its passed flag and
severity), an op in a job (``OpExecutionContext``; logs and a custom message) and the op of
a graph-backed asset. Each payload is a local script, uploaded with the submission. In run
scope the run's allocation is gone once the run has ended.
"""

import dagster as dg
import pytest
from compute_support import compute, squeue_names, wait_until, write_payload

from dagster_slurm import ComputeResource, SlurmRunAllocationConfig

pytestmark = pytest.mark.integration

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
        metadata={"negatives": 2},
    )
"""

OP = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.log.info("hello from the op payload")
    pipes.report_custom_message({"answer": 42})
"""

#: What the step's log says about where the payload ran, per scope.
RAN_IN = {"asset": "Submitted Slurm job", "run": "completed in run allocation"}


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


@pytest.fixture(params=["asset", "run"])
def scope(request) -> str:
    return request.param


@pytest.fixture
def resource(env, scope) -> ComputeResource:
    if scope == "asset":
        return compute(env)
    return compute(env, allocation_scope="run",
                   run_allocation=SlurmRunAllocationConfig(heartbeat_interval=2.0))


@pytest.fixture
def instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.ephemeral()


def _logs(instance: dg.DagsterInstance, result) -> list[str]:
    return [entry.user_message or "" for entry in instance.all_logs(result.run_id)]


def _ran_on_slurm(env, instance: dg.DagsterInstance, result, scope: str) -> None:
    """The run succeeded, its payloads ran as the scope runs them, and in run scope its
    allocation ended with the run."""
    assert result.success
    assert any(RAN_IN[scope] in line for line in _logs(instance, result))
    if scope == "run":
        wait_until(lambda: not squeue_names(env, f"dsr-{result.run_id}"), 60,
                   "the run's allocation to end")


def _materializations(result) -> dict[str, dict[str, object]]:
    return {
        event.materialization.asset_key.to_user_string(): {
            key: value.value for key, value in event.materialization.metadata.items()}
        for event in result.get_asset_materialization_events()
    }


@pytest.mark.release_subset
def test_asset(env, scope, resource, instance, tmp_path):
    payload = write_payload(tmp_path, "materialize.py", MATERIALIZE)

    @dg.asset
    def numbers(context: dg.AssetExecutionContext, compute: ComputeResource):
        return compute.run(context=context, payload_path=payload).get_materialize_result()

    result = dg.materialize([numbers], resources={"compute": resource}, instance=instance)
    _ran_on_slurm(env, instance, result, scope)
    (metadata,) = _materializations(result).values()
    assert metadata["rows"] == 3
    assert metadata["dagster_slurm/mode"] == "slurm" and metadata["dagster_slurm/job_id"]


def test_multi_asset(env, scope, resource, instance, tmp_path):
    payload = write_payload(tmp_path, "multi.py", MULTI)

    @dg.multi_asset(specs=[dg.AssetSpec("left"), dg.AssetSpec("right")])
    def sides(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    result = dg.materialize([sides], resources={"compute": resource}, instance=instance)
    _ran_on_slurm(env, instance, result, scope)
    found = _materializations(result)
    assert sorted(found) == ["left", "right"]
    assert (found["left"]["rows"], found["right"]["rows"]) == (1, 2)
    assert found["left"]["dagster_slurm/job_id"] == found["right"]["dagster_slurm/job_id"]


@pytest.mark.parametrize(("passed", "severity"), [(False, "WARN"), (True, "ERROR")])
def test_asset_check(env, scope, resource, instance, tmp_path, passed, severity):
    payload = write_payload(tmp_path, "check.py", CHECK)

    @dg.asset
    def numbers() -> list[int]:
        return [1, -2, -3]

    @dg.asset_check(asset=numbers)
    def no_negatives(context: dg.AssetCheckExecutionContext, compute: ComputeResource):
        return compute.run(context=context, payload_path=payload,
                           extras={"passed": passed, "severity": severity},
                           ).get_asset_check_result()

    result = dg.materialize([numbers, no_negatives], resources={"compute": resource},
                            instance=instance)
    _ran_on_slurm(env, instance, result, scope)
    (evaluation,) = result.get_asset_check_evaluations()
    assert (evaluation.asset_key, evaluation.check_name) == (dg.AssetKey("numbers"), "no_negatives")
    assert evaluation.passed is passed
    assert evaluation.severity == dg.AssetCheckSeverity(severity)
    assert evaluation.metadata["negatives"].value == 2
    assert evaluation.metadata["dagster_slurm/mode"].value == "slurm"


def test_op_in_a_job(env, scope, resource, instance, tmp_path):
    payload = write_payload(tmp_path, "op.py", OP)

    @dg.op
    def ask(context: dg.OpExecutionContext, compute: ComputeResource) -> list:
        return list(compute.run(context=context, payload_path=payload).get_custom_messages())

    @dg.job
    def asking():
        ask()

    result = asking.execute_in_process(resources={"compute": resource}, instance=instance)
    _ran_on_slurm(env, instance, result, scope)
    assert result.output_for_node("ask") == [{"answer": 42}]
    assert "hello from the op payload" in _logs(instance, result)
    assert not result.get_asset_materialization_events()


def test_op_of_a_graph_backed_asset(env, scope, resource, instance, tmp_path):
    payload = write_payload(tmp_path, "graph.py", MATERIALIZE)

    @dg.op
    def build(context: dg.OpExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload).get_results()

    @dg.graph_asset
    def built():
        return build()

    result = dg.materialize([built], resources={"compute": resource}, instance=instance)
    _ran_on_slurm(env, instance, result, scope)
    found = _materializations(result)
    assert list(found) == ["built"]
    assert found["built"]["rows"] == 3 and found["built"]["dagster_slurm/mode"] == "slurm"
