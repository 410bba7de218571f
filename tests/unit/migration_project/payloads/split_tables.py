"""Payload of the multi-asset: one materialization for each table it writes."""

import os

from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    run_label = os.environ["SPLIT_LABEL"]
    pipes.report_asset_materialization(asset_key="warehouse/orders",
                                       metadata={"rows": 5, "label": run_label})
    pipes.report_asset_materialization(asset_key="customers",
                                       metadata={"rows": 4, "label": run_label})
