"""The payload: reads what the asset passed and reports a materialization through Pipes."""

import os

from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as context:
    context.log.info(f"KEY_ENV={os.environ['KEY_ENV']} foo={context.get_extra('foo')}")
    context.report_asset_materialization(
        metadata={"key_env": os.environ["KEY_ENV"], "foo": context.get_extra("foo")}
    )
