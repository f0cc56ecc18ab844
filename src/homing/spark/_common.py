"""Options, connections and deterministic ids shared by the homing data sources."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from homing.errors import ConfigurationError
from homing.store import Store, open_store

FORMAT = "homing"
# uuid5 namespace of every id homing.spark derives (rows by key columns, staged batches).
NAMESPACE = uuid.UUID("6f1f2b0e-6d3b-5c8e-9a57-686f6d696e67")

_stores: dict[tuple[int, str], Store] = {}
_stores_lock = threading.Lock()


def option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """Spark passes options case-insensitively; look one up either way."""
    if name in options:
        return options[name]
    lowered = {k.lower(): v for k, v in options.items()}
    return lowered.get(name.lower(), default)


def required(options: Mapping[str, str], name: str, what: str) -> str:
    value = option(options, name)
    if not value:
        raise ConfigurationError(f'the homing data source needs .option("{name}", ...): {what}')
    return value


def int_option(options: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = option(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"option {name}={raw!r} must be an integer") from None
    if value < minimum:
        raise ConfigurationError(f"option {name}={raw!r} must be at least {minimum}")
    return value


def store_url(options: Mapping[str, str]) -> str:
    """The store URL with a SQLite path made absolute (executors may run elsewhere)."""
    url = required(options, "url", "the store URL (sqlite:////abs/path.db or postgresql://...)")
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        rest = url[len("sqlite:///") :]
        path, sep, query = rest.partition("?")
        url = "sqlite:///" + os.path.abspath(path) + sep + query
    return url


def is_local_master(master: str | None) -> bool:
    """True for masters whose executors share this host's file system (local, local-cluster)."""
    if master is None:
        return True
    return master == "local" or master.startswith(("local[", "local-cluster["))


def check_master(url: str, master: str | None) -> None:
    """Refuse a SQLite store with a Spark master whose executors may run on other hosts."""
    if url.startswith("sqlite:") and not is_local_master(master):
        raise ConfigurationError(
            f"a SQLite store ({url}) works only with a local Spark master (local[*], "
            f"local-cluster[...]), not {master!r}: SQLite is one file on one host. Use a "
            "PostgreSQL store (postgresql://...) with a cluster master"
        )


def task_master() -> str | None:
    """The Spark master as seen by the running task (None outside a task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.getLocalProperty("spark.master") if ctx is not None else None


def task_property(name: str) -> str | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.getLocalProperty(name) if ctx is not None else None


def store_for(url: str) -> Store:
    """One store per process and URL (Python workers are reused between tasks)."""
    key = (os.getpid(), url)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_store(url, pool_size=2)
        return store


def migrate_once(url: str) -> None:
    """Apply pending migrations (driver side, before any task touches the store)."""
    store_for(url).migrate()


def derive_id(*parts: Any) -> str:
    """A deterministic UUID (v5) from values: the same inputs give the same id everywhere."""
    import json

    return str(uuid.uuid5(NAMESPACE, json.dumps(list(parts), default=str, separators=(",", ":"))))
