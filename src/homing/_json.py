"""Strict JSON for anything that arrives from outside (HTTP bodies, API calls).

Python's ``json`` accepts NaN/Infinity, keeps the last of duplicate keys, recurses without
bound and parses integers of any size; each is a way for bad input to slip through or to
cost a server dearly. ``strict_loads`` refuses all four with a message that says what to do,
raising the caller's error class (an ``InvalidArgument`` subclass), so each face keeps its
own error type.
"""

from __future__ import annotations

import json
from typing import Any

from homing.errors import InvalidArgument

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
