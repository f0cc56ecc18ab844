"""The housekeeper thread: runs ``homing gc`` (every growing table's clean-up, see
``homing.housekeeping``) from inside the worker every ``gc_every`` seconds, so that a
deployment that only runs workers stays bounded without a cron entry, and VACUUMs
homing's tables every ``vacuum_every`` seconds on a PostgreSQL server without autovacuum. The first pass comes
after a random fraction of the interval, so that many workers started together do not all
clean at once; each pass is short transactions of its own."""

from __future__ import annotations

import logging
import math
import random
import time
from typing import TYPE_CHECKING

from homing.database import Database, ShardedDatabase
from homing.housekeeping import collect

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


def warn_about_the_store(w: Worker) -> None:
    """Say at start what of the store's setup will slow grabs down (PostgreSQL without
    autovacuum); a store that cannot tell, or is down now, says nothing."""
    for db in _stores(w):
        try:
            db.store.warn_if_never_vacuumed()
        except Exception as exc:  # the check is advice, never a reason to stop
            log.debug("could not read the store's autovacuum setting: %s", exc)


def keep_tidy(w: Worker) -> None:
    """Garbage collection every ``gc_every`` seconds and, where the server does not
    autovacuum, homing's own VACUUM every ``vacuum_every``; the first of each after a random
    fraction of its interval, so that workers started together spread out."""
    warn_about_the_store(w)
    now = time.monotonic()
    next_gc = now + w.gc_every * random.uniform(0.1, 1.0) if w.gc_every > 0 else math.inf
    next_vacuum = (
        now + w.vacuum_every * random.uniform(0.1, 1.0) if w.vacuum_every > 0 else math.inf
    )
    while not w._stopped.wait(max(0.0, min(next_gc, next_vacuum) - time.monotonic())):
        now = time.monotonic()
        if now >= next_gc:
            collect_garbage(w)
            next_gc = now + w.gc_every
        if now >= next_vacuum:
            vacuum(w)
            next_vacuum = now + w.vacuum_every


def _stores(w: Worker) -> list[Database]:
    return w.db.live_shards() if isinstance(w.db, ShardedDatabase) else [w.db]


def collect_garbage(w: Worker) -> None:
    try:
        deleted: dict[str, int] = {}
        for db in _stores(w):
            for table, n in collect(db).items():
                deleted[table] = deleted.get(table, 0) + n
        log.info(
            "gc: %s",
            " ".join(f"{t}={n}" for t, n in sorted(deleted.items())) or "nothing to do",
            extra={"homing": {"event": "gc", "deleted": deleted}},
        )
    except Exception as exc:  # the store is down or busy: try again next time
        log.warning("gc failed (%s); next try in %gs", exc, w.gc_every)


def vacuum(w: Worker) -> None:
    """The dead index entries of finished jobs slow every grab until a VACUUM removes
    them; without autovacuum nobody else will."""
    try:
        for db in _stores(w):
            started = time.monotonic()
            tables = db.store.vacuum_if_due(w.vacuum_every)
            if tables:
                log.info(
                    "vacuum: %s in %.2fs (autovacuum is off)",
                    " ".join(tables),
                    time.monotonic() - started,
                    extra={"homing": {"event": "vacuum", "tables": tables}},
                )
    except Exception as exc:  # the store is down or busy: try again next time
        log.warning("vacuum failed (%s); next try in %gs", exc, w.vacuum_every)
