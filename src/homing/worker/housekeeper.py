"""The housekeeper thread: ``homing.upkeep`` on the worker's schedule (``gc_every``,
``vacuum_every``), so that a deployment that only runs workers stays bounded without a
cron entry, over the worker's store or the live shards of a sharded one."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from homing import upkeep
from homing.database import Database, ShardedDatabase

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


def keep_tidy(w: Worker) -> None:
    """Runs until the worker stops (its housekeeper thread)."""
    upkeep.keep_tidy(
        lambda: _stores(w),
        w._stopped,
        gc_every=w.gc_every,
        vacuum_every=w.vacuum_every,
        log=log,
    )


def _stores(w: Worker) -> list[Database]:
    return w.db.live_shards() if isinstance(w.db, ShardedDatabase) else [w.db]
