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
