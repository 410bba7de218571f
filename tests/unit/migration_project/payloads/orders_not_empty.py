"""Payload of the asset check on warehouse/orders: reports whether it passed."""

from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    pipes.report_asset_check(asset_key="warehouse/orders", check_name="orders_not_empty",
                             passed=True, metadata={"checked_by": pipes.get_extra("team")})
