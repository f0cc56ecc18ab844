"""The processes a run starts beside Spark: the delivery workers (killed and replaced during
the run) and the receivers, which must be listening before the first delivery."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from homing.errors import HomingError
from homing.pipeline.config import PipelineConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HomingError(f"the receiver process exited early (code {proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise HomingError(f"the local receiver did not listen on port {port} within {timeout:g}s")


def stop_processes(procs: list[subprocess.Popen[bytes]], grace: float = 20.0) -> None:
    """SIGTERM each live process, then wait ``grace`` seconds for each; SIGKILL the rest."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _worker_url(url: str) -> str:
    """The delivery workers' store URL: on SQLite, waiting for each other's write lock in
    short polls (``lock_wait=poll``, docs/jobs.md): three busy writer processes with a
    backlog, where SQLite's growing busy-handler sleeps leave the lock idle."""
    if not url.startswith("sqlite:") or "lock_wait=" in url:
        return url
    return url + ("&" if "?" in url else "?") + "lock_wait=poll"


class Fleet:
    """The delivery worker processes; kills some with SIGKILL and replaces them."""

    def __init__(
        self,
        cfg: PipelineConfig,
        smtp_port: int,
        http_port: int,
        logs: Path,
        shards: list[str] | None = None,
    ) -> None:
        self.cfg = cfg
        # On a sharded store each worker serves one shard (its jobs, and the outbox rows
        # their transactions wrote there): at least one worker per shard.
        self.shards = [_worker_url(url) for url in (shards or [cfg.db])]
        self.args = [
            sys.executable,
            "-m",
            "homing.pipeline.deliver",
            "--smtp-port",
            str(smtp_port),
            "--http-port",
            str(http_port),
            "--concurrency",
            str(cfg.concurrency),
            "--lock-for",
            str(cfg.lock_for),
            "--retry-scale",
            str(cfg.retry_scale),
            # messages may wait in this run's backlog longer than the compressed
            # "4.5 days": give up no earlier than the run's own timeout
            "--give-up-after",
            str(max(4.5 * 86400 * cfg.retry_scale, cfg.timeout)),
        ]
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.serves: dict[subprocess.Popen[bytes], str] = {}
        # each worker's name; a replacement takes its dead predecessor's name, and with it
        # the jobs it left leased (homing.worker.takeover), instead of waiting out the leases
        self.names: dict[subprocess.Popen[bytes], str] = {}
        self.killed = 0
        self.started = 0
        self.stopped = False  # set by stop(): no spawn after it (the monitor may race it)
        self._lock = threading.Lock()

    def spawn(self, shard: str | None = None, name: str | None = None) -> None:
        with self._lock:
            if not self.stopped:
                self._spawn(shard, name or f"deliver-{self.started}")

    def _spawn(self, shard: str | None, name: str) -> None:
        if shard is None:  # the first shard with the fewest workers
            serving = [self.serves[p] for p in self.procs]
            shard = min(self.shards, key=serving.count)
        log = (self.logs / f"worker-{self.started}.log").open("ab")
        proc = subprocess.Popen(
            [*self.args, "--db", shard, "--name", name],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        self.procs.append(proc)
        self.serves[proc] = shard
        self.names[proc] = name
        self.started += 1

    def start(self) -> None:
        for i in range(max(self.cfg.workers, len(self.shards))):
            self.spawn(self.shards[i % len(self.shards)])

    def kill_one(self) -> None:
        alive = [p for p in self.procs if p.poll() is None]
        if not alive:
            return
        victim = random.choice(alive)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.procs.remove(victim)
        self.killed += 1
        self.spawn(self.serves.pop(victim), self.names.pop(victim))

    def respawn_dead(self) -> int:
        dead = [p for p in self.procs if p.poll() is not None]
        for p in dead:
            self.procs.remove(p)
            self.spawn(self.serves.pop(p), self.names.pop(p))
        return len(dead)

    def stop(self) -> None:
        """Stop every worker; the monitor thread may still be respawning dead ones: once
        this holds the lock, nothing is spawned any more (a timed-out run left workers
        running on before)."""
        with self._lock:
            self.stopped = True
        stop_processes(list(self.procs))
