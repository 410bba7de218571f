"""ArrayProgress: per-partition messages, metadata and failures of a multi-partition run."""

import base64
import json

import dagster as dg
import pytest
from dagster_pipes import decode_param

from dagster_slurm.jobs.array_files import ArrayLayout, tasks_file_content
from dagster_slurm.jobs.array_tasks import ArrayProgress, SlurmArrayTasksFailed, TaskEnd

KEYS = ["a", "b b", "$(c)"]


def _message(method: str, **params: object) -> bytes:
    return (json.dumps({"__dagster_pipes_version": "0.1", "method": method,
                        "params": params}) + "\n").encode()


def _materialization(**metadata: object) -> bytes:
    return _message("report_asset_materialization", asset_key="sample", data_version=None,
                    metadata={k: {"raw_value": v, "type": "int"} for k, v in metadata.items()})


def _run(body, keys=KEYS):
    """Run ``body(context, progress)`` inside a real single-run step over ``keys``;
    returns the result and the instance."""
    partitions = dg.StaticPartitionsDefinition(keys)
    captured = {}

    @dg.asset(name="sample", partitions_def=partitions)
    def sample(context: dg.AssetExecutionContext):
        op = context.op_execution_context
        progress = ArrayProgress(op, ArrayLayout("/jobs/x").tasks(keys))
        captured["progress"] = progress
        body(op, progress)
        progress.raise_failures()
        yield from progress.results()

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([sample], instance=instance, raise_on_error=False, tags={
        "dagster/asset_partition_range_start": keys[0],
        "dagster/asset_partition_range_end": keys[-1]})
    return result, instance, captured["progress"]


def _materialized(instance):
    records = instance.fetch_materializations(dg.AssetKey("sample"), limit=100).records
    return [(r.asset_materialization.partition,
             {k: v.value for k, v in r.asset_materialization.metadata.items()}) for r in records]


def test_every_partition_is_materialized_once_with_its_own_metadata():
    def body(context, progress):
        for task in progress.tasks:
            progress.feed(task.position, _message("log", message="hi", level="info"))
            progress.feed(task.position, _materialization(length=len(task.key)), final=True)
            progress.finish(task.position, TaskEnd(f"7_{task.position}", "COMPLETED", 0,
                                                   {"dagster_slurm/job_id": f"7_{task.position}"}))
        progress.add_figures(1, {"dagster_slurm/elapsed_seconds": 1.5})

    result, instance, _ = _run(body)

    assert result.success
    found = dict(_materialized(instance))
    assert sorted(found) == sorted(KEYS)
    for position, key in enumerate(KEYS):
        assert found[key]["length"] == len(key)
        assert found[key]["dagster_slurm/job_id"] == f"7_{position}"
    assert found["b b"]["dagster_slurm/elapsed_seconds"] == 1.5
    assert len(_materialized(instance)) == len(KEYS)
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert "[b b] hi" in logs


def test_failed_partitions_are_named_and_only_the_others_materialized():
    def body(context, progress):
        for task in progress.tasks:
            end = (TaskEnd("7_1", "FAILED", 3) if task.key == "b b"
                   else TaskEnd(f"7_{task.position}", "COMPLETED", 0))
            progress.feed(task.position, _materialization(length=1), final=True)
            progress.finish(task.position, end, stderr_tail="boom\n")

    result, instance, progress = _run(body)

    assert not result.success
    assert sorted(p for p, _ in _materialized(instance)) == ["$(c)", "a"]
    (failure,) = progress.failures.values()
    assert failure.key == "b b" and failure.end.exit_code == 3
    error = SlurmArrayTasksFailed(list(progress.failures.values()), ["a", "$(c)"], 3)
    assert "1 of 3 partitions failed: 'b b'" in str(error)
    assert "exit code 3" in str(error) and "boom" in str(error)


def test_a_message_split_across_reads_and_an_unterminated_last_line_are_read():
    def body(context, progress):
        line = _materialization(length=9)
        progress.feed(0, line[:10])
        progress.feed(0, line[10:-1], final=True)  # no newline at the end
        progress.finish(0, TaskEnd("7_0", "COMPLETED", 0))
        for position in (1, 2):
            progress.finish(position, TaskEnd(f"7_{position}", "COMPLETED", 0))

    result, instance, _ = _run(body)

    assert result.success
    assert dict(_materialized(instance))["a"]["length"] == 9


def test_a_cancelled_task_fails_even_with_exit_status_zero():
    assert not TaskEnd("7_0", "CANCELLED", 0).succeeded
    assert not TaskEnd("7_0", "UNKNOWN", None).succeeded
    assert TaskEnd("7_0", "COMPLETED", None).succeeded


def test_a_retried_task_is_read_again_from_the_start():
    def body(context, progress):
        progress.finish(0, TaskEnd("7_0", "FAILED", 1))
        progress.retry([0])
        assert 0 in progress.open_positions and not progress.failures
        progress.feed(0, _materialization(length=5), final=True)
        for position in range(3):
            progress.finish(position, TaskEnd(f"8_{position}", "COMPLETED", 0))

    result, instance, _ = _run(body)

    assert result.success
    assert dict(_materialized(instance))["a"]["length"] == 5


@pytest.mark.parametrize("key", ["plain", "a\tb?", "é ✓", "$(x) `y` 'z'", "line\nbreak"])
def test_the_tasks_file_carries_each_key_and_its_pipes_files(key):
    (task,) = ArrayLayout("/jobs/x").tasks([key])
    (line,) = tasks_file_content([task]).splitlines()
    name, encoded, context, messages = line.split("\t")
    assert name == "0"
    assert base64.b64decode(encoded).decode() == key
    assert decode_param(context) == {"path": "/jobs/x/tasks/0/pipes_context.json"}
    assert decode_param(messages) == {"path": "/jobs/x/tasks/0/pipes_messages.jsonl"}
