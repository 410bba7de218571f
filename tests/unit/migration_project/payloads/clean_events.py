"""Payload of clean_events: reads where the raw events are and how to chunk them."""

import os

from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    chunk = pipes.get_extra("settings")["chunk_rows"]
    pipes.log.info(f"cleaning {os.environ['RAW_EVENTS']} in chunks of {chunk} rows")
    pipes.report_asset_materialization(
        metadata={"source": os.environ["RAW_EVENTS"], "chunk_rows": chunk,
                  "team": pipes.get_extra("team")}
    )
