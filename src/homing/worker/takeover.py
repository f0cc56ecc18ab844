"""A restarted worker takes back, at once, the jobs its dead predecessor left running.

A worker process that dies (SIGKILL, OOM, a power cut of its container) leaves its jobs
leased until the leases run out (``lock_for``), and nothing runs them meanwhile. When a
worker with an explicit name starts (``homing worker --name deliver-1``, a systemd
instance, a supervisor's slot), it ends the leases held by an earlier process of the same
name on the same host whose pid no longer runs: their jobs are taken over at once through
the expired-lease path, as if their leases had run out (each with its history entry), and
the dead process's completions stay refused by their tokens. DBOS recovers a restarted
executor's workflows by its executor id in the same way.

The name is the contract: give each worker process of a host its own name. Two processes
with one name on hosts that share a hostname but not their process ids (containers on the
host's network) could end each other's leases, hence nothing is taken over for the
default name ``worker``.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING

from homing._process import alive
from homing.database import ShardedDatabase
from homing.store import holders_queries as hq
from homing.store import jobs_queries as q

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")

DEFAULT_NAME = "worker"


def predecessor_of(holder_worker: str | None, holder_pid: int | None, name: str) -> bool:
    """Whether a lease was held by a dead process of this host with this worker name
    (its worker id is ``host:pid:name``)."""
    if not holder_worker or holder_pid is None or holder_pid == os.getpid():
        return False
    parts = holder_worker.split(":", 2)
    return len(parts) == 3 and parts[2] == name and not alive(int(holder_pid))


def take_back(w: Worker) -> int:
    """End the leases of this worker's dead predecessors on this host; how many."""
    if w.name == DEFAULT_NAME:
        return 0
    host = socket.gethostname()
    stores = list(w.db.shards) if isinstance(w.db, ShardedDatabase) else [w.db]
    freed = 0
    for db in stores:
        try:
            with db.store.transaction() as tx:
                dead = [
                    (job_id, token)
                    for job_id, token, pid, worker in hq.leases_on_host(tx, host)
                    if predecessor_of(worker, pid, w.name)
                ]
                if dead:
                    freed += q.expire_leases(tx, dead, now=db.clock.now())
        except Exception as exc:  # a shard down: its leases run out as before
            log.warning("could not take back a dead predecessor's jobs on %s: %s", db.url, exc)
    if freed:
        log.info(
            "worker %s took back %d jobs a dead process of the same name left running",
            w.worker_id,
            freed,
            extra={"homing": {"event": "jobs_taken_back", "jobs": freed}},
        )
    return freed
