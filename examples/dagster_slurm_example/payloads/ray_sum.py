"""A Ray payload: connects to the Ray cluster the launcher started and spreads work over it."""

import ray
from dagster_pipes import open_dagster_pipes


@ray.remote
def partial_sum(start: int, stop: int) -> int:
    return sum(range(start, stop))


def main() -> None:
    with open_dagster_pipes() as pipes:
        ray.init(address="auto", logging_level="ERROR")
        nodes = [node for node in ray.nodes() if node["Alive"]]
        total = sum(ray.get([partial_sum.remote(i * 1000, (i + 1) * 1000) for i in range(8)]))
        pipes.log.info(f"summed on {len(nodes)} Ray node(s)")
        pipes.report_asset_materialization(metadata={"total": total, "ray_nodes": len(nodes)})


if __name__ == "__main__":
    main()
