"""Materialize every asset of the example project and print what happened, with one line
naming the assets left out on this machine and why (no such line when none was)."""

from __future__ import annotations

import sys

import dagster as dg
from dagster_slurm_example.availability import skipped_line
from dagster_slurm_example.definitions import ASSETS, RESOURCES, SKIPPED


def main() -> int:
    result = dg.materialize(ASSETS, resources=RESOURCES, instance=dg.DagsterInstance.ephemeral())
    for event in result.get_asset_materialization_events():
        mat = event.materialization
        shown = {k: v.value for k, v in mat.metadata.items() if not k.startswith("dagster_slurm/")}
        where = mat.metadata.get("dagster_slurm/job_id")
        print(f"materialized {mat.asset_key.to_user_string()} (job {where.value if where else '?'}): {shown}")
    for check in result.get_asset_check_evaluations():
        print(f"check {check.check_name}: {'passed' if check.passed else 'FAILED'}")
    if SKIPPED:
        print(skipped_line(SKIPPED))
    print("run succeeded" if result.success else "run FAILED")
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
