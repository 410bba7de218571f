"""The array example (examples/dagster_slurm_arrays): its definitions load, a run over a
range of its partitions runs one payload per key in local mode, names the keys that fail on
purpose and materializes the others once each; its command re-runs the failed ones; and
docs/arrays.md quotes its code as it is.

The same on Slurm (one job array, 200 keys): tests/integration/test_partition_arrays.py.
"""

import re
import sys
from pathlib import Path

import dagster as dg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from dagster_slurm_arrays import defs  # noqa: E402
from dagster_slurm_arrays.__main__ import contiguous, main  # noqa: E402
from dagster_slurm_arrays.definitions import FAILING, KEYS, samples  # noqa: E402

from dagster_slurm import ComputeResource  # noqa: E402

RANGE = {"dagster/asset_partition_range_start": "sample-000",
         "dagster/asset_partition_range_end": "sample-009"}


def test_the_definitions_load() -> None:
    dg.Definitions.validate_loadable(defs)
    assets_def = defs.resolve_assets_def("samples")
    assert assets_def.partitions_def.get_partition_keys() == KEYS and len(KEYS) == 200
    assert assets_def.backfill_policy == dg.BackfillPolicy.single_run()
    assert defs.resources["compute"].mode == "local"


def _materialized(instance: dg.DagsterInstance) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for record in instance.fetch_materializations(samples.key, limit=1000).records:
        event = record.asset_materialization
        assert event.partition not in found, f"{event.partition!r} materialized twice"
        found[event.partition] = {k: v.value for k, v in event.metadata.items()}
    return found


def test_a_range_runs_once_per_key_and_names_the_failures(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_SLURM_LOCAL_BASE", str(tmp_path / "runs"))
    instance = dg.DagsterInstance.ephemeral()
    config = {"work_dir": str(tmp_path / "work"), "fail_first_try": ["sample-003", "sample-007"],
              "array_parallelism": 3}
    result = dg.materialize([samples], instance=instance, raise_on_error=False, tags=RANGE,
                            resources={"compute": ComputeResource(mode="local")},
                            run_config={"ops": {"samples": {"config": config}}})
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error = failure.event_specific_data.error
    while error.cause is not None:
        error = error.cause
    assert error.message.startswith("dagster_slurm.jobs.array_tasks.SlurmArrayTasksFailed: "
                                    "2 of 10 partitions failed: 'sample-003', 'sample-007'.")
    assert "exit code 3" in error.message and "sample-007: failing on purpose" in error.message
    materialized = _materialized(instance)
    expected = [f"sample-{i:03d}" for i in range(10) if i not in (3, 7)]
    assert sorted(materialized) == expected
    assert len({m["dagster_slurm/job_id"] for m in materialized.values()}) == 8
    for metadata in materialized.values():
        assert len(metadata["checksum"]) == 12  # what the payload reported
        assert metadata["dagster_slurm/state"] == "COMPLETED"
        assert metadata["dagster_slurm/exit_code"] == 0


def test_the_command_reruns_the_failed_partitions(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DAGSTER_SLURM_LOCAL_BASE", str(tmp_path / "runs"))
    assert main(["10"]) == 0
    out = capsys.readouterr().out
    assert "run over sample-000..sample-009: 8 of 10 partitions materialized" in out
    assert "2 of 10 partitions failed: 'sample-007', 'sample-008'" in out
    assert "run of sample-007..sample-008 again: succeeded" in out
    assert "materialized partitions: 10 of 10" in out


def test_failed_keys_are_cut_into_contiguous_runs() -> None:
    assert contiguous(FAILING) == [["sample-007", "sample-008"], ["sample-042"], ["sample-150"]]
    assert contiguous([]) == []


QUOTE = re.compile(r"<!-- quoted from (?P<path>\S+) -->\n```python\n(?P<code>.*?)\n```", re.S)


def test_docs_arrays_page_quotes_the_example_as_it_is() -> None:
    page = (ROOT / "docs" / "arrays.md").read_text(encoding="utf-8")
    quotes = list(QUOTE.finditer(page))
    assert len(quotes) >= 2, "docs/arrays.md quotes the example's code"
    for quote in quotes:
        source = (ROOT / quote["path"]).read_text(encoding="utf-8")
        assert quote["code"] in source, (
            f"docs/arrays.md quotes {quote['path']} in a form the file no longer has:\n"
            f"{quote['code'][:400]}")
