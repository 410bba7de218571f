"""A Python payload: computes something and reports it to Dagster through Pipes."""

import socket

from dagster_pipes import open_dagster_pipes


def main() -> None:
    with open_dagster_pipes() as pipes:
        count = int(pipes.extras.get("count", 10))
        squares = [i * i for i in range(1, count + 1)]
        pipes.log.info(f"computed {len(squares)} squares on {socket.gethostname()}")
        pipes.report_asset_materialization(
            metadata={"count": len(squares), "total": sum(squares), "host": socket.gethostname()}
        )
        pipes.report_asset_check(
            check_name="squares_are_positive",
            passed=all(value > 0 for value in squares),
            metadata={"minimum": min(squares)},
        )


if __name__ == "__main__":
    main()
