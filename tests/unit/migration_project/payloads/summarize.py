"""Payload of the summary assets: reports the table it summarized."""

import os

from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"summarized": os.environ["SUMMARY_INPUT"]})
