"""Ray payload of fit_model: joins the Ray cluster its launcher started."""

import os

import ray
from dagster_pipes import open_dagster_pipes


@ray.remote
def cube(value: int) -> int:
    return value**3


with open_dagster_pipes() as pipes:
    ray.init(address="auto", logging_level="ERROR")
    total = sum(ray.get([cube.remote(i) for i in range(6)]))
    pipes.report_asset_materialization(metadata={"model_dir": os.environ["MODEL_DIR"], "total": total})
