"""The housekeeper thread: runs ``homing gc`` (every growing table's clean-up, see
``homing.housekeeping``) from inside the worker every ``gc_every`` seconds, so that a
deployment that only runs workers stays bounded without a cron entry. The first pass comes
after a random fraction of the interval, so that many workers started together do not all
clean at once; each pass is short transactions of its own."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from homing.database import ShardedDatabase
from homing.housekeeping import collect

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


def warn_about_the_store(w: Worker) -> None:
    """Say at start what of the store's setup will slow grabs down (PostgreSQL without
    autovacuum); a store that cannot tell, or is down now, says nothing."""
    stores = w.db.live_shards() if isinstance(w.db, ShardedDatabase) else [w.db]
    for db in stores:
        try:
            db.store.warn_if_never_vacuumed()
        except Exception as exc:  # the check is advice, never a reason to stop
            log.debug("could not read the store's autovacuum setting: %s", exc)


def keep_tidy(w: Worker) -> None:
    warn_about_the_store(w)
    delay = w.gc_every * random.uniform(0.1, 1.0)  # spreads workers started together
    while not w._stopped.wait(delay):
        delay = w.gc_every
        try:
            stores = w.db.live_shards() if isinstance(w.db, ShardedDatabase) else [w.db]
            deleted: dict[str, int] = {}
            for db in stores:
                for table, n in collect(db).items():
                    deleted[table] = deleted.get(table, 0) + n
            log.info(
                "gc: %s",
                " ".join(f"{t}={n}" for t, n in sorted(deleted.items())) or "nothing to do",
                extra={"homing": {"event": "gc", "deleted": deleted}},
            )
        except Exception as exc:  # the store is down or busy: try again next time
            log.warning("gc failed (%s); next try in %gs", exc, w.gc_every)
