"""The deployment test's payload: reports a materialization at once, or (``hold``) logs
that it runs and then waits until its job is cancelled or reaches its walltime."""

import os
import time

from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    pipes.log.info(f"payload running in job {os.environ.get('SLURM_JOB_ID')}")
    if pipes.extras.get("hold"):
        while True:  # nothing releases it: only scancel or the walltime ends the job
            time.sleep(1)
    pipes.report_asset_materialization(metadata={"slurm_job_id": os.environ["SLURM_JOB_ID"]})
