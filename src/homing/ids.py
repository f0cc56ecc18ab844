"""Globally unique, time-ordered message ids (UUIDv7, RFC 9562) made by the sender."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0
# Random bytes drawn from the OS 4 KiB at a time (one system call per ~400 ids instead of
# one or two per id); a forked child starts with none, so it never repeats its parent's.
_POOL_SIZE = 4096
_pool = b""
_pool_at = 0


def _after_fork_in_child() -> None:
    """The child draws its own random bytes, and gets a fresh lock: a thread of the parent
    may have held it at the fork, and that thread does not exist in the child."""
    global _pool, _pool_at, _lock
    _pool, _pool_at = b"", 0
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _random(n: int) -> int:
    """``n`` random bytes from the pool as an int; call with ``_lock`` held."""
    return int.from_bytes(_random_bytes(n), "big")


def _random_bytes(n: int) -> bytes:
    """``n`` random bytes from the pool (straight from the OS when more than it holds);
    call with ``_lock`` held."""
    global _pool, _pool_at
    if n > _POOL_SIZE:
        return os.urandom(n)
    if _pool_at + n > len(_pool):
        _pool, _pool_at = os.urandom(_POOL_SIZE), 0
    start = _pool_at
    _pool_at += n
    return _pool[start : start + n]


def uuid7() -> str:
    """Return a new UUIDv7 as text; ids made in one process sort in creation order.

    Within one millisecond a 12-bit counter (seeded randomly) keeps them increasing, so a
    sequence of ids from one producer is monotonic even at high rates.
    """
    return uuid7_many(1)[0]


def uuid7_many(n: int) -> list[str]:
    """``n`` new UUIDv7s in creation order, under one lock and one clock read (a batch
    insert makes one id a job: per id, ``uuid7`` cost about as much as the insert's SQL)."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = _random(2) & 0x7FF
        else:
            _counter += 1
            ms = _last_ms
        rand = _random_bytes(8 * n).hex()  # 62 random bits an id, as hex text
        out: list[str] = []
        prefix = _prefix(ms)
        counter = _counter
        for i in range(0, 16 * n, 16):
            if counter > 0xFFF:  # counter overflow: borrow the next millisecond
                _last_ms += 1
                counter = 0
                prefix = _prefix(_last_ms)
            r = rand[i : i + 16]  # version 7, then the 12-bit counter; variant 0b10
            out.append(f"{prefix}{counter:03x}-{_VARIANT[int(r[0], 16) & 3]}{r[1:4]}-{r[4:]}")
            counter += 1
        _counter = counter - 1  # the last counter used: the next call starts after it
    return out


_VARIANT = "89ab"


def _prefix(ms: int) -> str:
    """The 48-bit millisecond timestamp and the version digit, as the text starts."""
    head = f"{ms & 0xFFFFFFFFFFFF:012x}"
    return f"{head[:8]}-{head[8:12]}-7"


_UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def is_uuid(text: str) -> bool:
    """True if ``text`` is a UUID in canonical text form."""
    return isinstance(text, str) and _UUID_TEXT.fullmatch(text) is not None


def job_uuid(text: str) -> str:
    """The job id that ``text`` stands for: a UUID as it is (lower case), any other string
    the UUID of its MD5 digest. Job ids are UUIDs (native ``uuid`` on PostgreSQL); a Spark
    sink's ``idColumn`` may hold other strings, which map to the same id every time, in
    Python as in the schema migration that converted stored ids (``md5(id)::uuid``)."""
    if is_uuid(text):
        return text.lower()
    h = hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
