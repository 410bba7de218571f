"""A multi-partition step whose process is SIGKILLed mid-array: the retried step attaches to
the array instead of submitting a second one (dev cluster, real Dagster multiprocess
executor, an op ``RetryPolicy``). Every key is processed once (an exclusive-create file per
key: a second run of a key would fail its task and the step), and every partition is
materialized once."""

import os
import signal
import tempfile
import threading
from pathlib import Path

import dagster as dg
import pytest
from arrays_support import PAYLOAD
from compute_support import compute, wait_until, write_payload

from dagster_slurm.compute.resource import ComputeResource

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).parent
KEYS = [f"a{i}" for i in range(6)]
PARTITIONS = dg.StaticPartitionsDefinition(KEYS)


@dg.asset(partitions_def=PARTITIONS, backfill_policy=dg.BackfillPolicy.single_run(),
          retry_policy=dg.RetryPolicy(max_retries=1))
def reattached(context: dg.AssetExecutionContext, compute: ComputeResource):
    marks = os.environ["DSLURM_TEST_MARKS"]
    Path(marks, f"pid-{context.retry_number}").write_text(str(os.getpid()))
    yield from compute.run(
        context=context, payload_path=os.environ["DSLURM_TEST_PAYLOAD"], array_parallelism=2,
        extra_env={"ARRAY_TEST_DIR": os.environ["DSLURM_TEST_ROOT"], "ARRAY_TEST_SLEEP": "3"},
    ).get_results()


def reattach_job() -> dg.JobDefinition:
    defs = dg.Definitions(
        assets=[reattached],
        resources={"compute": compute(dict(os.environ))},
        jobs=[dg.define_asset_job("arrays_reattach", executor_def=dg.multiprocess_executor,
                                  partitions_def=PARTITIONS)],
    )
    return defs.resolve_job_def("arrays_reattach")


def _killer(root: Path, marks: Path, failures: list[BaseException]) -> None:
    """SIGKILL the step's first process once two keys are done (more are running)."""
    try:
        wait_until(lambda: len(list((root / "done").iterdir())) >= 2, 180, "two keys done")
        pid = int((marks / "pid-0").read_text())
        os.kill(pid, signal.SIGKILL)
        (marks / "killed").write_text(str(pid))
    except BaseException as exc:  # noqa: BLE001 - reported by the test's assertion
        failures.append(exc)


@pytest.mark.slow
def test_a_killed_multi_partition_step_reattaches_to_its_array(slurm_cluster, tmp_path,
                                                              monkeypatch):
    root = Path(tempfile.mkdtemp(prefix="arrays-", dir=slurm_cluster.state_dir))
    for directory in (root, root / "done", root / "fail"):
        directory.mkdir(exist_ok=True)
        directory.chmod(0o777)
    marks = tmp_path / "marks"
    marks.mkdir()
    settings = {**slurm_cluster.env(), "DSLURM_TEST_MARKS": str(marks),
                "DSLURM_TEST_ROOT": str(root),
                "DSLURM_TEST_PAYLOAD": write_payload(tmp_path, "partition.py", PAYLOAD),
                "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(HERE)  # step processes import this module from the working directory
    failures: list[BaseException] = []
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        killer = threading.Thread(target=_killer, args=(root, marks, failures), daemon=True)
        killer.start()
        result = dg.execute_job(dg.reconstructable(reattach_job), instance=instance, tags={
            "dagster/asset_partition_range_start": KEYS[0],
            "dagster/asset_partition_range_end": KEYS[-1]})
        logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
        materialized = result.get_asset_materialization_events()
    killer.join(10)
    assert not failures, failures
    assert result.success, logs
    assert (marks / "killed").read_text() == (marks / "pid-0").read_text()
    assert (marks / "pid-1").exists(), "the step was not retried"
    assert any("Reattached to Slurm job array" in message for message in logs), logs
    assert len(list((root / "done").iterdir())) == len(KEYS)  # each key once
    partitions = sorted(e.event_specific_data.materialization.partition for e in materialized)
    assert partitions == KEYS
    arrays = {e.event_specific_data.materialization.metadata["dagster_slurm/job_id"].value
              .split("_")[0] for e in materialized}
    assert len(arrays) == 1, arrays
