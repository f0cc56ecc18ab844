"""Globally unique, time-ordered message ids (UUIDv7, RFC 9562) made by the sender."""

from __future__ import annotations

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
    global _pool, _pool_at
    if _pool_at + n > len(_pool):
        _pool, _pool_at = os.urandom(_POOL_SIZE), 0
    start = _pool_at
    _pool_at += n
    return int.from_bytes(_pool[start : start + n], "big")


def uuid7() -> str:
    """Return a new UUIDv7 as text; ids made in one process sort in creation order.

    Within one millisecond a 12-bit counter (seeded randomly) keeps them increasing, so a
    sequence of ids from one producer is monotonic even at high rates.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = _random(2) & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter overflow: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        counter = _counter
        rand_b = _random(8) & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= (counter & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand_b
    h = f"{value:032x}"  # formatted by hand: uuid.UUID costs more than the rest together
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def is_uuid(text: str) -> bool:
    """True if ``text`` is a UUID in canonical text form."""
    return isinstance(text, str) and _UUID_TEXT.fullmatch(text) is not None
