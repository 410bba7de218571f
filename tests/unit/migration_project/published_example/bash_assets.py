"""Assets run by the Bash launcher: each takes ``SlurmRunConfig`` as its run configuration
and hands it to ``compute.run``, so the launchpad can set it; the code is the same for local
and Slurm deployments."""

import dagster as dg

from dagster_slurm import ComputeResource, SlurmRunConfig


def payload(name: str) -> str:
    """The path of one of the project's payload scripts."""
    return dg.file_relative_path(__file__, f"../payloads/{name}")


@dg.asset(group_name="events")
def clean_events(context: dg.AssetExecutionContext, compute: ComputeResource,
                 config: SlurmRunConfig):
    """Cleans the raw events; the payload gets variables and extras."""
    completed = compute.run(
        context=context,
        payload_path=payload("clean_events.py"),
        config=config,
        extra_env={"RAW_EVENTS": "/data/raw/events", "CLEAN_EVENTS": "/data/clean/events"},
        extras={"team": "analytics", "settings": {"chunk_rows": 500}},
    )
    yield from completed.get_results()
    yield dg.AssetObservation(asset_key=context.asset_key,
                              metadata={"mode": str(compute.mode)})


@dg.asset(group_name="events", deps=[clean_events])
def daily_summary(context: dg.AssetExecutionContext, compute: ComputeResource,
                  config: SlurmRunConfig):
    """Summarizes the cleaned events."""
    return compute.run(
        context=context,
        payload_path=payload("summarize.py"),
        config=config,
        extra_env={"SUMMARY_INPUT": "/data/clean/events"},
    ).get_results()


@dg.multi_asset(specs=[dg.AssetSpec(["warehouse", "orders"]), dg.AssetSpec("customers")],
                group_name="warehouse")
def split_tables(context: dg.AssetExecutionContext, compute: ComputeResource,
                 config: SlurmRunConfig):
    """One payload writing two tables."""
    return compute.run(
        context=context,
        payload_path=payload("split_tables.py"),
        config=config,
        extra_env={"SPLIT_LABEL": "nightly"},
    ).get_results()


@dg.asset_check(asset=dg.AssetKey(["warehouse", "orders"]), blocking=True)
def orders_not_empty(context: dg.AssetCheckExecutionContext,
                     compute: ComputeResource) -> dg.AssetCheckResult:
    """A blocking check whose result the payload reports."""
    return compute.run(
        context=context,
        payload_path=payload("orders_not_empty.py"),
        extras={"team": "analytics"},
    ).get_asset_check_result()
