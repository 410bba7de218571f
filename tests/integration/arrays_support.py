"""The partitioned asset and payload of the job-array tests (test_partition_arrays.py), also
used by the script those tests run in a process of its own."""

import hashlib
from pathlib import Path

import dagster as dg

from dagster_slurm.compute.resource import ComputeResource

PARALLELISM = 3

#: The payload: checks its key, records it once (exclusive create, so a second run of the
#: same key fails), with its start and end, and fails on purpose when told so.
PAYLOAD = """
import hashlib, json, os, sys, time
from dagster_pipes import open_dagster_pipes

root = os.environ["ARRAY_TEST_DIR"]
with open_dagster_pipes() as pipes:
    key = pipes.partition_key
    assert key == os.environ["DAGSTER_SLURM_PARTITION_KEY"], (key, os.environ["DAGSTER_SLURM_PARTITION_KEY"])
    assert pipes.partition_key_range["start"] == key == pipes.partition_key_range["end"]
    name = hashlib.sha256(key.encode()).hexdigest()
    start = time.time()
    time.sleep(float(os.environ.get("ARRAY_TEST_SLEEP", "0.3")))
    if os.path.exists(os.path.join(root, "fail", name)):
        print(f"failing on purpose: {key}", file=sys.stderr)
        if os.environ.get("ARRAY_TEST_FAIL_ONCE"):
            os.remove(os.path.join(root, "fail", name))
        sys.exit(3)
    fd = os.open(os.path.join(root, "done", name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"key": key, "start": start, "end": time.time()}, handle)
    pipes.log.info(f"processed {key}")
    pipes.report_asset_materialization(metadata={"key_length": len(key)})
"""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def partitioned_asset(keys: list[str], root: Path, payload: str, parallelism: int = PARALLELISM,
                      retries: int = 0, env: dict[str, str] | None = None):
    partitions = dg.StaticPartitionsDefinition(keys)

    @dg.asset(name="sample", partitions_def=partitions,
              backfill_policy=dg.BackfillPolicy.single_run())
    def sample(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload,
                               extra_env={"ARRAY_TEST_DIR": str(root), **(env or {})},
                               array_parallelism=parallelism,
                               array_retries=retries).get_results()

    return sample


def materialize_range(asset, resource, instance, first: str, last: str) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [asset], instance=instance, resources={"compute": resource}, raise_on_error=False,
        tags={"dagster/asset_partition_range_start": first,
              "dagster/asset_partition_range_end": last})
