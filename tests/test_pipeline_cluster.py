"""The pipeline on a real Spark standalone cluster (master, worker and executor JVMs started
as a cluster is started), against PostgreSQL, with an executor SIGKILLed mid-replace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from homing.pipeline.cluster import StandaloneCluster, executor_pids
from tests.conftest import StoreFactory

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_pipeline_on_a_standalone_cluster_survives_an_executor_kill(tmp_path: Path) -> None:
    """One worker with two cores: the SIGKILLed executor held the replace's running tasks
    after they staged their rows; the master starts a new executor, Spark re-runs the
    tasks, the driver commits once: every child exactly once, every delivery once."""
    factory = StoreFactory("postgres", tmp_path)
    url = factory.url("cluster")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PYTHONPATH"] = str(HERE.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")
    try:
        with StandaloneCluster(1, cores=2, work_dir=tmp_path / "cluster") as cluster:
            assert cluster.status()["workers"][0]["state"] == "ALIVE"
            result = subprocess.run(
                [sys.executable, "-m", "homing", "--db", url, "pipeline", "run"]
                + ["--master", cluster.url, "--kill-executor", "--events", "2"]
                + ["--subscribers", "12", "--workers", "1", "--kills", "1", "--lock-for", "2"]
                + ["--data-dir", str(tmp_path / "data"), "--timeout", "300", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                cwd=tmp_path,
            )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        report = json.loads(result.stdout[result.stdout.index("{\n") :])
        assert report["master"] == cluster.url
        assert report["spark"]["executors_killed"] == 1
        assert report["spark"]["staged_batches_at_kill"] >= 1
        assert not executor_pids(report["spark"]["app_id"])  # the cluster stopped them
        checks = report["checks"]
        assert checks["subscriptions"] == report["expected"]["subscriptions"] == 24
        assert checks["notifications"] == report["expected"]["notifications"]
        assert checks["lost"] == 0 and checks["duplicated"] == 0 and checks["unexpected"] == 0
        assert checks["ok"]
    finally:
        factory.cleanup()
