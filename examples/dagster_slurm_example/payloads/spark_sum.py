"""A PySpark payload: the driver of a Spark application, reporting its result through Pipes.

The launcher sets SPARK_MASTER_URL: the master of the Spark cluster it started in the job,
or local[*] (Spark inside this process) in local mode.
"""

import os

from dagster_pipes import open_dagster_pipes
from pyspark.sql import SparkSession


def main() -> None:
    with open_dagster_pipes() as pipes:
        master = os.environ.get("SPARK_MASTER_URL", "local[*]")
        spark = (
            SparkSession.builder.master(master)
            .appName("dagster-slurm-example")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        try:
            spark.sparkContext.setLogLevel("ERROR")
            numbers = spark.sparkContext.parallelize(range(1, 100_001), numSlices=8)
            total = numbers.map(lambda n: n * n).sum()
            executors = spark.sparkContext.defaultParallelism
            pipes.log.info(f"summed 100000 squares with Spark master {master}")
            pipes.report_asset_materialization(
                metadata={"sum_of_squares": int(total), "master": master,
                          "default_parallelism": executors}
            )
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
