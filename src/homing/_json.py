"""Strict JSON for anything that arrives from outside (HTTP bodies, API calls).

Python's ``json`` accepts NaN/Infinity, keeps the last of duplicate keys, recurses without
bound and parses integers of any size; each is a way for bad input to slip through or to
cost a server dearly. ``strict_loads`` refuses all four with a message that says what to do,
raising the caller's error class (an ``InvalidArgument`` subclass), so each face keeps its
own error type. Going out, ``compact`` and ``encode_limited`` are the one JSON encoder of
homing (compact, no NaN, with a size limit where one applies).
"""

from __future__ import annotations

import json
from typing import Any

from homing.errors import InvalidArgument, PayloadTooLarge

MAX_DEPTH = 64
MAX_INT = 2**63


def _depth_ok(data: bytes, limit: int) -> bool:
    """Nesting depth from a byte scan, before parsing (so deep input cannot recurse)."""
    depth = 0
    in_str = False
    esc = False
    for ch in data:
        if in_str:
            if esc:
                esc = False
            elif ch == 0x5C:
                esc = True
            elif ch == 0x22:
                in_str = False
        elif ch == 0x22:
            in_str = True
        elif ch in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif ch in (0x5D, 0x7D):
            depth -= 1
    return True


def strict_loads(data: bytes, error: type[InvalidArgument] = InvalidArgument) -> Any:
    """Parse JSON refusing NaN/Infinity, duplicate keys, deep nesting and huge integers."""

    def no_constants(name: str) -> Any:
        raise error(f"JSON body contains {name}, which is not JSON; send finite numbers only")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise error(f"JSON body has the key {key[:80]!r} twice in one object; send it once")
            out[key] = value
        return out

    def bounded_int(text: str) -> int:
        if len(text) > 20:
            raise error(
                f"JSON body has an integer of {len(text)} digits; integers must be below 2**63 "
                "(send big numbers as strings)"
            )
        value = int(text)
        if not -MAX_INT <= value < MAX_INT:
            raise error(f"JSON integer {value} is outside the 64-bit range; send it as a string")
        return value

    if not _depth_ok(data, MAX_DEPTH):
        raise error(f"JSON body is nested deeper than {MAX_DEPTH} levels; flatten it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"JSON body is not UTF-8: {exc}") from exc
    try:
        return json.loads(
            text,
            object_pairs_hook=no_duplicates,
            parse_constant=no_constants,
            parse_int=bounded_int,
        )
    except error:
        raise
    except (ValueError, RecursionError) as exc:
        raise error(f"invalid JSON: the body is not valid JSON ({exc})") from exc


_COMPACT = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def compact(value: Any, *, what: str) -> str:
    """Compact JSON text of ``value`` (no NaN or Infinity), or an ``InvalidArgument`` that
    starts with ``what`` (e.g. "job args must be JSON (...)"). One reusable encoder:
    ``json.dumps`` with options builds a new one on every call."""
    try:
        return _COMPACT.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what}: {exc}") from exc


def encode_limited(value: Any, limit: int, *, what: str, setting: str) -> str:
    """``compact`` within ``limit`` bytes, or a ``PayloadTooLarge`` naming the ``setting``
    that raises the limit: the one size-limited JSON encoder of homing."""
    text = compact(value, what=f"{what} must be JSON (dict, list, str, number, bool, None; no NaN)")
    size = len(text) if text.isascii() else len(text.encode())
    if size > limit:
        raise PayloadTooLarge(
            f"{what}: {size} bytes, over the limit of {limit}; store large data elsewhere "
            f"and pass a reference, or raise {setting}"
        )
    return text
