"""The code location: the assets and the check of both modules, with the resources of
``DAGSTER_DEPLOYMENT`` (see resources.py)."""

import dagster as dg

from published_example import bash_assets, ray_assets
from published_example.resources import get_resources


@dg.definitions
def defs() -> dg.Definitions:
    """Built when the code location loads, so the deployment is read then."""
    return dg.Definitions(
        assets=dg.load_assets_from_modules([bash_assets, ray_assets]),
        asset_checks=dg.load_asset_checks_from_modules([bash_assets]),
        resources=get_resources(),
    )
