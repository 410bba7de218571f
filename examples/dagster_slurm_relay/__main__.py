"""Materialize the relay example and print what each payload run did.

``python -m dagster_slurm_relay [UNITS [UNIT_SECONDS]]`` with ``examples`` on PYTHONPATH;
local mode unless DAGSTER_SLURM_MODE=slurm.
"""

from __future__ import annotations

import sys

import dagster as dg

from dagster_slurm_relay import defs


def main(argv: list[str]) -> int:
    ops: dict = {}
    if argv:
        ops["units"] = int(argv[0])
    if len(argv) > 1:
        ops["unit_seconds"] = float(argv[1])
    job = defs.get_implicit_global_asset_job_def()
    result = job.execute_in_process(
        instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"relayed_units": {"config": ops}}},
    )
    for event in result.get_asset_materialization_events():
        metadata = event.materialization.metadata
        for entry in metadata["rounds"].value:
            print(f"allocation {entry['allocation']}: {len(entry['units'])} unit(s) committed, "
                  f"drained={entry['drained']}, exit code {entry['exit_code']}, "
                  f"{entry['remaining']} remaining")
    print("run succeeded" if result.success else "run FAILED")
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
