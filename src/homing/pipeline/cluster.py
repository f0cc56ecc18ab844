"""A real Spark standalone cluster on this host, started as a cluster is started.

``StandaloneCluster`` launches a master and workers with the launcher classes the installed
pyspark ships (``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker spark://...``; SPARK_HOME is pyspark's package directory), each in
its own process group, bound to 127.0.0.1 on free ports, logs under a work directory. It
waits until every worker has registered with the master (the master's JSON status page)
and stops them at the end. The driver, the master, the workers and the executors are
separate JVMs that find each other over the network, as on a real cluster.

``ExecutorKiller`` SIGKILLs one executor JVM (``CoarseGrainedExecutorBackend`` of *this*
application) while a replace is writing, for the pipeline's ``--kill-executor``.

``python -m homing.pipeline.cluster -- CMD ...`` runs CMD with ``HOMING_SPARK_MASTER`` set
to a fresh cluster's URL and stops the cluster afterwards (``make run-cluster`` uses it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from homing.errors import ConfigurationError, HomingError

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# --kill-executor: each executor Python worker's first write task holds this long after
# staging its rows, so the kill lands between the tasks' writes and the driver's commit.
HOLD_MS = 4000


def spark_home() -> Path:
    """pyspark's package directory: it ships ``bin/spark-class`` and the jars."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise ConfigurationError(f"no bin/spark-class under {home}: reinstall pyspark")
    return home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (a context manager)."""

    def __init__(
        self,
        workers: int = 1,
        *,
        cores: int = 2,
        memory: str = "2g",
        work_dir: Path | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ConfigurationError("a cluster needs at least one worker with one core")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.start_timeout = start_timeout
        self._own_dir = work_dir is None
        self.dir = Path(work_dir or tempfile.mkdtemp(prefix="homing-spark-cluster-"))
        self.port = 0
        self.ui_port = 0
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SPARK_HOME"] = str(spark_home())
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["SPARK_LOG_DIR"] = str(self.dir / "logs")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        return env

    def _launch(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        log = (self.dir / "logs" / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(),
            start_new_session=True,  # its own process group: stop() kills the whole JVM tree
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> StandaloneCluster:
        self.port, self.ui_port = _free_port(), _free_port()
        self._launch(
            "master",
            MASTER_CLASS,
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        try:
            for i in range(self.workers):
                work = self.dir / f"worker-{i}"
                work.mkdir(parents=True, exist_ok=True)
                self._launch(
                    f"worker-{i}",
                    WORKER_CLASS,
                    *("--host", "127.0.0.1", "--port", str(_free_port())),
                    *("--webui-port", str(_free_port()), "--cores", str(self.cores)),
                    *("--memory", self.memory, "--work-dir", str(work)),
                    self.url,
                )
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications)."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return dict(json.load(answer))

    def _wait_registered(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        seen = 0
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise HomingError(
                        f"a Spark cluster process exited early (code {proc.returncode}); "
                        f"see the logs in {self.dir / 'logs'}"
                    )
            try:
                workers = self.status().get("workers", [])
                seen = sum(1 for w in workers if w.get("state") == "ALIVE")
                if seen >= self.workers:
                    return
            except (OSError, ValueError):
                pass  # the master's web UI is not up yet, or answered before it was ready
            time.sleep(0.3)
        raise HomingError(
            f"{seen} of {self.workers} Spark workers registered with {self.url} within "
            f"{self.start_timeout:g}s; see the logs in {self.dir / 'logs'}"
        )

    def stop(self) -> None:
        """SIGTERM each process group (the JVM and its executors), SIGKILL what remains."""
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # executors of the worker, if any are left
            proc.wait()
        self.procs.clear()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def executor_pids(app_id: str) -> list[int]:
    """The executor JVMs of one Spark application on this host (from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if EXECUTOR_CLASS in words and app_id in words:
            pids.append(int(entry.name))
    return sorted(pids)


class ExecutorKiller:
    """SIGKILL one executor JVM of ``spark``'s application while a replace is staging rows.

    The trigger is the store's own state, not timing: a Spark write has staged rows that no
    driver commit has published yet. The kill then lands between the tasks' writes and the
    commit, where a lost or a doubled child would show up. Only executors of this
    application (its id is on their command line) are candidates."""

    def __init__(self, spark: Any, db: Any, poll: float = 0.05) -> None:
        self.app_id = str(spark.sparkContext.applicationId)
        self.db = db
        self.since = time.time()
        self.poll = poll
        self.killed: list[int] = []
        self.staged_at_kill = 0
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="executor-killer", daemon=True)

    def start(self) -> ExecutorKiller:
        self._thread.start()
        return self

    def _pending(self) -> int:
        from homing.store import spark_queries as sq

        total = 0
        for shard in getattr(self.db, "shards", [self.db]):
            with shard.store.transaction(write=False) as tx:
                total += sq.staged_unpublished(tx, self.since)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pending = self._pending()
                pids = executor_pids(self.app_id) if pending else []
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    self.killed.append(pids[0])
                    self.staged_at_kill = pending
                    self.at = time.time()
                    return
            except Exception:
                pass
            self._stop.wait(self.poll)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def report(self) -> dict[str, Any]:
        return {
            "app_id": self.app_id,
            "executors_killed": len(self.killed),
            "pids": self.killed,
            "staged_batches_at_kill": self.staged_at_kill,
            "killed_after_s": round(self.at - self.since, 2) if self.at else None,
        }


def start_executor_killer(spark: Any, db: Any) -> ExecutorKiller:
    return ExecutorKiller(spark, db).start()


def main(argv: list[str] | None = None) -> int:
    """``python -m homing.pipeline.cluster [--workers N] [--cores C] -- CMD ...``"""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--memory", default="2g")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path("pipeline-data/spark-cluster"),
        help="logs and worker directories (emptied first)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    a = parser.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        parser.error("give the command to run against the cluster after --")
    shutil.rmtree(a.work_dir, ignore_errors=True)
    work = a.work_dir.resolve()
    with StandaloneCluster(a.workers, cores=a.cores, memory=a.memory, work_dir=work) as cluster:
        print(
            f"Spark standalone cluster {cluster.url}: {a.workers} worker(s) x {a.cores} "
            f"core(s), master UI http://127.0.0.1:{cluster.ui_port}, logs {cluster.dir}/logs",
            flush=True,
        )
        env = dict(os.environ, HOMING_SPARK_MASTER=cluster.url)
        cmd = [c.replace("{master}", cluster.url) for c in command]
        return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
