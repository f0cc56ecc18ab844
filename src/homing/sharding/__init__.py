"""Sharded stores: several PostgreSQL databases behind one API (see docs/jobs.md, "Sharding").

``open_sharded`` is what ``homing.connect([url, url, ...])`` calls: each shard is opened
without waiting for it (``lazy``), with short timeouts, and migrated in parallel; a shard
that does not answer starts marked down instead of failing the whole store.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from homing.database import Database
from homing.errors import ConfigurationError, HomingError, StoreUnavailable, StoreUnreachable
from homing.sharding.database import ShardedDatabase
from homing.sharding.placement import Placement, owner

__all__ = ["Placement", "ShardedDatabase", "open_sharded", "owner"]

CONNECT_TIMEOUT_S = 3.0  # a new connection to a shard: libpq connect_timeout
POOL_TIMEOUT_S = 5.0  # waiting for a pooled connection before the shard is marked down


def open_sharded(
    urls: Sequence[str],
    *,
    migrate: bool,
    previous_shards: int | None = None,
    **options: Any,
) -> ShardedDatabase:
    """Open every shard; those that cannot be reached start down (all down: an error)."""
    from homing.store import open_store

    dbs: list[Database] = []
    try:
        for i, url in enumerate(urls):
            if not isinstance(url, str) or not url.startswith(("postgresql:", "postgres:")):
                raise ConfigurationError(f"shards must be PostgreSQL databases; {url!r} is not")
            store = open_store(
                url,
                clock=options["clock"],
                durable=options["durable"],
                pool_size=options["pool_size"],
                connect_timeout=CONNECT_TIMEOUT_S,
                pool_timeout=POOL_TIMEOUT_S,
                lazy=True,
            )
            dbs.append(
                Database(
                    store,
                    shard=i,
                    max_args_bytes=options["max_args_bytes"],
                    retention=options["retention"],
                )
            )
        down = _first_contact(dbs, migrate)
        if len(down) == len(dbs):
            raise StoreUnreachable(
                "no shard of the sharded store could be reached: "
                + "; ".join(f"shard {i}: {exc}" for i, exc in down)
            )
        return ShardedDatabase(
            dbs, previous_shards=previous_shards, down=down, migrate_on_probe=migrate
        )
    except BaseException:
        for db in dbs:
            db.close()
        raise


def _first_contact(dbs: list[Database], migrate: bool) -> list[tuple[int, BaseException]]:
    """Migrate (or just reach) every shard at once; return the ones that did not answer."""

    def touch(db: Database) -> BaseException | None:
        try:
            if migrate:
                db.migrate()
            else:
                db.stats(window=1.0)
        except StoreUnavailable as exc:
            return exc
        except HomingError:
            raise
        return None

    with ThreadPoolExecutor(max_workers=len(dbs)) as pool:
        results = list(pool.map(touch, dbs))
    return [(i, exc) for i, exc in enumerate(results) if exc is not None]
