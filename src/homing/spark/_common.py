"""Options, connections and deterministic ids shared by the homing data sources."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
import zlib
from collections.abc import Mapping, Sequence
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


def _absolute(url: str) -> str:
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        rest = url[len("sqlite:///") :]
        path, sep, query = rest.partition("?")
        url = "sqlite:///" + os.path.abspath(path) + sep + query
    return url


def store_url(options: Mapping[str, str]) -> str:
    """The store URL with a SQLite path made absolute (executors may run elsewhere).

    A sharded store is its PostgreSQL URLs separated by commas, as for ``homing --db``."""
    url = required(options, "url", "the store URL (sqlite:////abs/path.db or postgresql://...)")
    urls = [_absolute(u.strip()) for u in url.split(",") if u.strip()]
    if len(urls) > 1 and any(u.startswith("sqlite:") for u in urls):
        raise ConfigurationError(f"shards must be PostgreSQL databases; {url!r} names SQLite")
    return ",".join(urls)


def shard_urls(url: str) -> list[str]:
    """The shards of a (normalised) store URL: one for a single store."""
    return url.split(",")


def shard_of(handle: str, shards: int) -> tuple[int, str]:
    """(shard, id) of a sharded handle ``"<shard>:<id>"``; an unprefixed id is placed by its
    hash, so the same id always lands on the same shard."""
    prefix, sep, rest = handle.partition(":")
    if sep and prefix.isdigit():
        if int(prefix) >= shards:
            raise ConfigurationError(f"{handle!r} names shard {prefix}; the store has {shards}")
        return int(prefix), rest
    return zlib.crc32(handle.encode()) % shards, handle


def lease_options(jobs: Sequence[Any]) -> dict[str, str]:
    """Options naming the parents one ``grab_many`` leased, for a read (only those jobs) and
    for ``replace_with``: ``leaseToken`` + ``parents`` on one store; on a sharded store, where
    each shard's grab has its own token, ``leases`` = ``"shard:token:count,..."``."""
    if not jobs:
        raise ConfigurationError("no jobs: grab the parents first")
    if all(j.handle == j.id for j in jobs):
        tokens = {j.lease_token for j in jobs}
        if len(tokens) != 1:
            raise ConfigurationError("the jobs were leased by several grabs; replace each apart")
        return {"leaseToken": jobs[0].lease_token, "parents": str(len(jobs))}
    groups: dict[tuple[int, str], int] = {}
    for j in jobs:
        shard = int(j.handle.split(":", 1)[0])
        groups[(shard, j.lease_token)] = groups.get((shard, j.lease_token), 0) + 1
    return {"leases": ",".join(f"{s}:{t}:{n}" for (s, t), n in sorted(groups.items()))}


def parse_leases(raw: str, shards: int) -> dict[int, tuple[str, int]]:
    """``"shard:token:count,..."`` -> {shard: (token, count)} (one grab per shard)."""
    out: dict[int, tuple[str, int]] = {}
    for item in raw.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
            raise ConfigurationError(f"option leases: {item!r} is not shard:token:count")
        shard = int(parts[0])
        if shard >= shards or shard in out:
            raise ConfigurationError(f"option leases: shard {shard} is unknown or given twice")
        out[shard] = (parts[1], int(parts[2]))
    return out


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
    """Apply pending migrations (driver side, before any task touches the store; each
    shard of a sharded store)."""
    for u in shard_urls(url):
        store_for(u).migrate()


_ID_JSON = json.JSONEncoder(default=str, separators=(",", ":"))
_NAMESPACE_BYTES = NAMESPACE.bytes


def derive_id(*parts: Any) -> str:
    """A deterministic UUID (v5) from values: the same inputs give the same id everywhere.

    ``str(uuid.uuid5(NAMESPACE, json.dumps(list(parts), default=str, separators=(",",
    ":"))))``, computed without building a JSON encoder and a ``UUID`` per call: the sink
    derives one per row (2.5x faster; tests/test_spark.py checks it against uuid5)."""
    digest = bytearray(
        hashlib.sha1(_NAMESPACE_BYTES + _ID_JSON.encode(list(parts)).encode()).digest()
    )
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest[:16].hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
