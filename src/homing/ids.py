"""Globally unique, time-ordered message ids (UUIDv7, RFC 9562) made by the sender."""

from __future__ import annotations

import os
import re
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0


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
            _counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter overflow: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            ms = _last_ms
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= (_counter & 0xFFF) << 64
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
