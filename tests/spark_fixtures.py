"""A session-scoped SparkSession for the homing.spark and pipeline tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

PYTHON = sys.executable


def spark_env() -> None:
    os.environ["PYSPARK_PYTHON"] = PYTHON
    os.environ["PYSPARK_DRIVER_PYTHON"] = PYTHON


def make_session(master: str = "local[2,2]", app: str = "homing-tests") -> Any:
    spark_env()
    from pyspark.sql import SparkSession

    import homing.spark

    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    homing.spark.register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """``local[2,2]``: two cores and up to two attempts per task, so task retries happen."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark needs Java 17: apt-get install -y openjdk-17-jre-headless")
    session = make_session()
    yield session
    session.stop()


def replace_children(spark: Any, url: str, token: str) -> None:
    """Replace the 4 parents leased under ``token`` by 100 children each."""
    import homing.spark

    parents = spark.read.format("homing").option("url", url).option("leaseToken", token).load()
    children = parents.selectExpr(
        "id AS parent_id", "explode(sequence(1, 100)) AS k", "'child' AS type"
    ).repartition(2)
    homing.spark.replace_with(children, url, lease_token=token, parents=4, keyColumns="parent_id,k")


if __name__ == "__main__":  # a driver process for the kill -9 test
    _, command, url, token = sys.argv
    assert command == "replace"
    replace_children(make_session("local[2]", "homing-kill-test"), url, token)
