"""Input checks of the job API: every public entry point checks its input with these
before it touches the store, so a refused call changes nothing."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from homing._json import encode_limited
from homing.errors import InvalidArgument

_MAX_TYPE_LEN = 200
_MAX_MESSAGE_LEN = 10_000


_CHECKED_TYPES: set[str] = set()  # names that passed: a few per application; bounded below


def check_type(name: Any) -> str:
    if type(name) is str and name in _CHECKED_TYPES:
        return name
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(f"job type must be a non-empty string, got {name!r}")
    if len(name) > _MAX_TYPE_LEN or any(ord(c) < 32 for c in name):
        raise InvalidArgument(
            f"job type {name[:50]!r} must be at most {_MAX_TYPE_LEN} printable characters"
        )
    if len(_CHECKED_TYPES) < 1024:
        _CHECKED_TYPES.add(name)
    return name


def check_types(types: Any) -> list[str]:
    if isinstance(types, str):
        return [check_type(types)]
    if not isinstance(types, list | tuple | set | frozenset) or not types:
        raise InvalidArgument(
            f"types must be a job type or a non-empty list of them, got {types!r}"
        )
    return sorted({check_type(t) for t in types})


def check_seconds(
    name: str, value: Any, *, allow_zero: bool, maximum: float | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidArgument(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidArgument(
            f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}"
        )
    if maximum is not None and seconds > maximum:
        raise InvalidArgument(f"{name}={value!r} is over the maximum of {maximum:g} seconds")
    return seconds


def check_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
        raise InvalidArgument(f"priority must be a 32-bit integer, got {value!r}")
    return value


def to_timestamp(name: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidArgument(f"{name} must be a timezone-aware datetime (naive: {value})")
        return value.timestamp()
    return check_seconds(name, value, allow_zero=True)


# Compact JSON text of a value within a byte limit, or a clear InvalidArgument: the one
# size-limited encoder (homing._json), under the name the faces import.
encode_json = encode_limited


def encode_args(args: Any, limit: int) -> str:
    return encode_limited(
        args, limit, what="job args", setting="max_args_bytes in homing.connect()"
    )


def check_message(message: Any) -> str:
    if not isinstance(message, str):
        raise InvalidArgument(f"failure message must be a string, got {type(message).__name__}")
    return message[:_MAX_MESSAGE_LEN]


def check_unique_key(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 500:
        raise InvalidArgument(
            f"unique_key must be a non-empty string of at most 500 characters, got {value!r}"
        )
    return value
