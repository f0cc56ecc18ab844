"""The pipeline's SparkSession, and a clear error when Java is missing."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from homing.errors import ConfigurationError


def java_missing() -> str | None:
    """How to install Java when it is missing (Spark needs Java 17 or 21), else None."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return None
    return (
        "Spark needs Java 17: install it with `sudo apt-get install -y openjdk-17-jre-headless` "
        "(Debian/Ubuntu), `brew install openjdk@17` (macOS) or `sudo dnf install "
        "java-17-openjdk-headless` (Fedora), or set JAVA_HOME to a Java 17 installation"
    )


def spark_session(master: str, *, hold_first_write_ms: int = 0) -> Any:
    """A SparkSession for the pipeline. ``hold_first_write_ms``: each executor Python
    worker's first write task waits that long after staging its rows (a failpoint), so that
    ``--kill-executor`` lands between the tasks' writes and the driver's commit."""
    problem = java_missing()
    if problem:
        raise ConfigurationError(problem)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("homing-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # rich draws the progress
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
    )
    if master.startswith(("spark://127.0.0.1:", "spark://localhost:")):
        # a cluster on this host: executors must reach the driver on the loopback address
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if hold_first_write_ms:
        builder = builder.config(
            "spark.executorEnv.HOMING_FAILPOINTS",
            f"spark.write.task_done=1*sleep({int(hold_first_write_ms)})",
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
