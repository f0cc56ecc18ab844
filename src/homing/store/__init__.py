"""The store: the only package that holds SQL. ``open_store(url)`` picks the backend."""

from __future__ import annotations

from homing.clock import Clock
from homing.errors import ConfigurationError
from homing.store._common import split_url
from homing.store.protocol import Dialect, Store, Tx

__all__ = ["Dialect", "Store", "Tx", "open_store"]


def open_store(
    url: str,
    *,
    clock: Clock | None = None,
    durable: bool | None = None,
    pool_size: int | None = None,
    **postgres: object,
) -> Store:
    """Open a store by URL. ``postgres``: ``PostgresStore`` options (``connect_timeout``,
    ``pool_timeout``, ``lazy``), used by sharded stores; ignored for SQLite."""
    scheme = split_url(url)[0]
    if scheme == "sqlite":
        from homing.store.sqlite import SQLiteStore

        return SQLiteStore(url, clock=clock, durable=durable)
    if scheme in ("postgresql", "postgres"):
        from homing.store.postgres import PostgresStore

        return PostgresStore(
            url,
            clock=clock,
            durable=durable,
            pool_size=pool_size,
            **postgres,  # type: ignore[arg-type]
        )
    raise ConfigurationError(
        f"unknown store URL scheme {scheme!r} in {url!r}; use sqlite:///file.db or postgresql://..."
    )
