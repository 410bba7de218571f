"""Materialize a range of the array example's partitions in one run, then run the failed
ones again.

``python -m dagster_slurm_arrays [KEYS]`` with ``examples`` on PYTHONPATH: the first KEYS
partitions (all 200 by default) in one run; local mode unless DAGSTER_SLURM_MODE=slurm.
Each invocation writes to a new work directory, so the failing keys fail again.
"""

from __future__ import annotations

import sys
import tempfile

import dagster as dg

from dagster_slurm_arrays import defs
from dagster_slurm_arrays.definitions import KEYS, samples

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def run_range(instance: dg.DagsterInstance, first: str, last: str,
              config: dict) -> dg.ExecuteInProcessResult:
    """One run over the partitions ``first`` to ``last``: a single step for all of them (a
    job array). For one key, a run for that partition (one job): a run over a range of one
    key would give the payload no partition key."""
    run = {"tags": {RANGE_START: first, RANGE_END: last}} if first != last else {
        "partition_key": first}
    return dg.materialize(
        [samples], instance=instance, resources={"compute": defs.resources["compute"]},
        run_config={"ops": {"samples": {"config": config}}}, raise_on_error=False, **run)


def contiguous(keys: list[str]) -> list[list[str]]:
    """``keys`` (in the order of KEYS) cut into runs of neighbouring partitions."""
    runs: list[list[str]] = []
    for key in keys:
        if runs and KEYS.index(runs[-1][-1]) + 1 == KEYS.index(key):
            runs[-1].append(key)
        else:
            runs.append([key])
    return runs


def missing(instance: dg.DagsterInstance, keys: list[str]) -> list[str]:
    """The partitions of ``keys`` that have no materialization yet."""
    done = instance.get_materialized_partitions(samples.key)
    return [key for key in keys if key not in done]


def main(argv: list[str]) -> int:
    keys = KEYS[: int(argv[0])] if argv else KEYS
    instance = dg.DagsterInstance.ephemeral()
    config = {"work_dir": tempfile.mkdtemp(prefix="dagster-slurm-arrays-")}
    result = run_range(instance, keys[0], keys[-1], config)
    failed = missing(instance, keys)
    print(f"run over {keys[0]}..{keys[-1]}: {len(keys) - len(failed)} of {len(keys)} "
          f"partitions materialized")
    for event in result.get_step_failure_events():
        error = event.event_specific_data.error
        while error.cause is not None:  # Dagster's wrapper, then the library's error
            error = error.cause
        print("the step failed: " + error.message.splitlines()[0])
    for run in contiguous(failed):  # the failed partitions again, a run per contiguous stretch
        again = run_range(instance, run[0], run[-1], config)
        what = f"{run[0]}..{run[-1]}" if len(run) > 1 else run[0]
        print(f"run of {what} again: {'succeeded' if again.success else 'FAILED'}")
    left = missing(instance, keys)
    print(f"materialized partitions: {len(keys) - len(left)} of {len(keys)}")
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
