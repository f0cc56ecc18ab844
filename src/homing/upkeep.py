"""Upkeep on a schedule, from inside a long-running process (a worker, a sessions server).

``homing gc`` (``homing.housekeeping.collect``) every ``gc_every`` seconds, so that a
deployment without a cron entry stays bounded, and a VACUUM of homing's tables that hold
dead rows every ``vacuum_every`` seconds on a PostgreSQL server without autovacuum (where
nobody else would: every dead index entry a queue leaves slows the statements that walk
past it). The first pass of each comes after a random fraction of its interval, so that
processes started together do not all clean at once; each pass is short transactions of
its own, and a pass that fails (the store is down or busy) is tried again at the next.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from homing.database import Database
from homing.housekeeping import collect

Stores = Callable[[], Sequence[Database]]


def keep_tidy(
    stores: Stores,
    stopped: threading.Event,
    *,
    gc_every: float,
    vacuum_every: float,
    log: logging.Logger,
) -> None:
    """Run until ``stopped`` is set: garbage collection every ``gc_every`` seconds and
    VACUUM every ``vacuum_every`` (0 turns either off). ``stores``: the stores to keep,
    asked again at each pass (a sharded deployment's live shards)."""
    warn_about_the_stores(stores, log)
    now = time.monotonic()
    next_gc = now + gc_every * random.uniform(0.1, 1.0) if gc_every > 0 else math.inf
    next_vacuum = now + vacuum_every * random.uniform(0.1, 1.0) if vacuum_every > 0 else math.inf
    while not stopped.wait(max(0.0, min(next_gc, next_vacuum) - time.monotonic())):
        now = time.monotonic()
        if now >= next_gc:
            collect_garbage(stores, log, retry_in=gc_every)
            next_gc = now + gc_every
        if now >= next_vacuum:
            vacuum(stores, log, every=vacuum_every)
            next_vacuum = now + vacuum_every


@contextmanager
def running(
    db: Database, *, gc_every: float, vacuum_every: float, log: logging.Logger
) -> Iterator[None]:
    """``keep_tidy`` for ``db`` in a daemon thread while the block runs (none when both
    schedules are off); on the way out a pass under way ends before the block's caller
    closes the store. For long-running commands (``homing serve``, ``homing sessions
    server``)."""
    if gc_every <= 0 and vacuum_every <= 0:
        yield
        return
    stopped = threading.Event()
    thread = threading.Thread(
        target=keep_tidy,
        args=(lambda: [db], stopped),
        kwargs={"gc_every": gc_every, "vacuum_every": vacuum_every, "log": log},
        name="homing-upkeep",
        daemon=True,
    )
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join(30)


def warn_about_the_stores(stores: Stores, log: logging.Logger) -> None:
    """Say at start what of the stores' setup will slow statements down (PostgreSQL
    without autovacuum); a store that cannot tell, or is down now, says nothing."""
    for db in stores():
        try:
            db.store.warn_if_never_vacuumed()
        except Exception as exc:  # the check is advice, never a reason to stop
            log.debug("could not read the store's autovacuum setting: %s", exc)


def collect_garbage(stores: Stores, log: logging.Logger, *, retry_in: float) -> None:
    """One ``homing gc`` pass over every store, logged with what it deleted."""
    try:
        deleted: dict[str, int] = {}
        for db in stores():
            for table, n in collect(db).items():
                deleted[table] = deleted.get(table, 0) + n
        log.info(
            "gc: %s",
            " ".join(f"{t}={n}" for t, n in sorted(deleted.items())) or "nothing to do",
            extra={"homing": {"event": "gc", "deleted": deleted}},
        )
    except Exception as exc:  # the store is down or busy: try again next time
        log.warning("gc failed (%s); next try in %gs", exc, retry_in)


def vacuum(stores: Stores, log: logging.Logger, *, every: float) -> None:
    """VACUUM the tables due for it, where the server does not (``Store.vacuum_if_due``)."""
    try:
        for db in stores():
            started = time.monotonic()
            tables = db.store.vacuum_if_due(every)
            if tables:
                log.info(
                    "vacuum: %s in %.2fs (autovacuum is off)",
                    " ".join(tables),
                    time.monotonic() - started,
                    extra={"homing": {"event": "vacuum", "tables": tables}},
                )
    except Exception as exc:  # the store is down or busy: try again next time
        log.warning("vacuum failed (%s); next try in %gs", exc, every)
