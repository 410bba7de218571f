"""compute.run_hetjob: its components checked before anything starts, the scheduler
overrides they give, and a local run (no cluster needed)."""

import textwrap

import dagster as dg
import pytest

from dagster_slurm import ComputeResource, HetJobComponent, SlurmQueueConfig
from dagster_slurm.compute.hetjob import check_components, het_overrides, local_component_env
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.commands import sbatch_argv
from dagster_slurm.slurm.hetjob import HetComponentSpec

CPU = {"partition": "cpu", "mem": "500M"}
GPU = {"partition": "gpu", "gpus_per_node": 1}


@pytest.mark.parametrize(("components", "field", "value"), [
    ([CPU, {**GPU, "partition": "g pu"}], "components[1].partition", "g pu"),
    ([CPU, {**GPU, "partitoin": "gpu"}], "components[1].partitoin", "gpu"),
    ([CPU, {**GPU, "nodes": 0}], "components[1].nodes", 0),
    ([{**CPU, "mem": "lots"}, GPU], "components[0].mem", "lots"),
    ([CPU, {**GPU, "gpus_per_node": -1}], "components[1].gpus_per_node", -1),
    ([CPU, {**GPU, "cpus_per_task": "two"}], "components[1].cpus_per_task", "two"),
    ([CPU, "gpu"], "components[1]", "gpu"),
    ([CPU], "components", [CPU]),
    ("cpu,gpu", "components", "cpu,gpu"),
])
def test_a_bad_component_is_named_as_the_caller_wrote_it(components, field, value):
    with pytest.raises(ConfigurationError) as caught:
        check_components(components)
    assert caught.value.field == field
    assert caught.value.value == value


def test_a_component_checks_its_values_when_built():
    with pytest.raises(Exception, match="nodes=0: must be at least 1"):
        HetJobComponent(nodes=0)


def test_component_0_is_the_job_and_the_others_follow_the_separator():
    components = check_components([CPU, HetJobComponent(**GPU, cpus_per_task=2)])
    overrides = het_overrides(components)
    assert overrides["het_components"] == (
        HetComponentSpec(partition="gpu", num_nodes=1, cpus_per_task=2, gpus_per_node=1),
    )
    queue = SlurmQueueConfig(partition="default", time_limit="00:10:00", cpus=4)
    spec = queue.to_sbatch_spec("dsl-het", "/jobs/job.sh", **overrides)
    argv = sbatch_argv(spec)
    separator = argv.index(":")
    first, second = argv[1:separator], argv[separator + 1:-1]
    # component 0: its own partition and memory, the queue's CPUs and time limit
    assert {"--partition=cpu", "--mem=500M", "--nodes=1", "--cpus-per-task=4",
            "--time=00:10:00"} <= set(first)
    assert second == ["--cpus-per-task=2", "--gpus-per-node=1", "--nodes=1", "--partition=gpu"]


def test_local_component_variables_name_this_host():
    env = local_component_env(check_components([CPU, GPU, CPU]))
    assert env["SLURM_HET_SIZE"] == "3"
    assert [env[f"SLURM_JOB_NODELIST_HET_GROUP_{i}"] for i in range(3)] == ["localhost"] * 3


PAYLOAD = """
import os
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={
        "size": os.environ["SLURM_HET_SIZE"],
        "nodes_1": os.environ["SLURM_JOB_NODELIST_HET_GROUP_1"],
    })
"""


def _het_asset(payload: str, components):
    @dg.asset
    def het(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run_hetjob(context, components=components,
                                      payload_path=payload).get_results()

    return het


def test_local_mode_runs_the_payload_once_with_the_component_variables(tmp_path):
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent(PAYLOAD))
    resource = ComputeResource(mode="local", local_base_path=str(tmp_path / "base"))
    result = dg.materialize([_het_asset(str(payload), [CPU, GPU])], resources={"compute": resource})
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["size"].value == "2" and metadata["nodes_1"].value == "localhost"
    assert metadata["dagster_slurm/mode"].value == "local"


def test_local_mode_refuses_a_bad_component_before_starting_anything(tmp_path):
    marker = tmp_path / "ran"
    payload = tmp_path / "payload.sh"
    payload.write_text(f"touch {marker}\n")
    resource = ComputeResource(mode="local", local_base_path=str(tmp_path / "base"))
    result = dg.materialize([_het_asset(str(payload), [CPU, {"nodes": -1}])],
                            resources={"compute": resource}, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "components[1].nodes=-1" in failure.step_failure_data.error.cause.message
    assert not marker.exists()


def test_run_scope_is_refused_with_the_reason(tmp_path):
    resource = ComputeResource(mode="local", allocation_scope="run")
    result = dg.materialize([_het_asset("true", [CPU, GPU])], resources={"compute": resource},
                            raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.cause.message
    assert "allocation_scope='run'" in message and "heterogeneous job" in message
