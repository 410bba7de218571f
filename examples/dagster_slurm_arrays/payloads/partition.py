"""Payload of the array example: the work of one partition of ``samples``.

It runs once per partition key, each run with the Pipes context of its own key. Pipes
extras: ``work_dir`` (a directory every task sees) and ``fail_first_try`` (keys whose first
try fails on purpose, exit code 3; a marker file in ``work_dir`` makes the next try of the
key succeed).
"""

import hashlib
import json
import os
import socket
import sys

from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    key = pipes.partition_key
    # A task of an array also finds its key, verbatim, in DAGSTER_SLURM_PARTITION_KEY (for
    # code that does not open Pipes); a run for one partition is one job, without it.
    assert key == os.environ.get("DAGSTER_SLURM_PARTITION_KEY", key)
    work_dir = pipes.get_extra("work_dir")
    name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]  # any key is a file name
    if key in pipes.get_extra("fail_first_try"):
        marker = os.path.join(work_dir, "tried", name)
        if not os.path.exists(marker):
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()
            print(f"{key}: failing on purpose (first try)", file=sys.stderr)
            sys.exit(3)
    checksum = hashlib.sha256(f"sample {key}".encode()).hexdigest()[:12]
    os.makedirs(os.path.join(work_dir, "results"), exist_ok=True)
    with open(os.path.join(work_dir, "results", f"{name}.json"), "w") as handle:
        json.dump({"key": key, "checksum": checksum}, handle)
    pipes.log.info(f"processed on {socket.gethostname()}")
    pipes.report_asset_materialization(metadata={"checksum": checksum})
