"""Strict JSON for anything that arrives from outside (HTTP bodies, API calls).

Python's ``json`` accepts NaN/Infinity (and numbers like 1e999 that overflow to it), keeps
the last of duplicate keys, recurses without bound and parses integers of any size; each
is a way for bad input to slip through or to cost a server dearly. ``strict_loads``
refuses all four with a message that says what to do, raising the caller's error class
(an ``InvalidArgument`` subclass), so each face keeps its own error type. Going out, ``compact`` and ``encode_limited`` are the one JSON encoder of
homing (compact, no NaN, with a size limit where one applies).
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from homing.errors import InvalidArgument, PayloadTooLarge

MAX_DEPTH = 64
MAX_INT = 2**63


# A JSON string, escapes included (an unterminated one runs to the end of the body).
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[0x5B] = _STEP[0x7B] = 1
_STEP[0x5D] = _STEP[0x7D] = -1
# No integer can leave the 64-bit range, and no number can overflow a float (to inf),
# without a run of 19 digits or an exponent of three digits somewhere in the body. Found
# on the body mapped to digits -> "0", e/E -> "e", +/- -> "+", the rest -> " ": one C pass
# and three substring searches (a regex search was 2-5x slower).
_NUMBER_SHAPE = bytes(
    48 if 48 <= b <= 57 else 101 if b in b"eE" else 43 if b in b"+-" else 32 for b in range(256)
)


def _may_hold_a_big_number(data: bytes) -> bool:
    shape = data.translate(_NUMBER_SHAPE)
    return b"0" * 19 in shape or b"e000" in shape or b"e+000" in shape


def _depth_ok(data: bytes, limit: int) -> bool:
    """Nesting depth before parsing (so deep input cannot recurse). At most as deep as there
    are opening brackets; else the brackets outside strings, summed as they come, by the
    regex engine, ``bytes.translate`` and ``itertools.accumulate`` (no Python loop a byte)."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return True
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) <= limit


class _Refused(ValueError):
    """Raised by the decoder's hooks; ``strict_loads`` re-raises it as the caller's class."""


def _no_constants(name: str) -> Any:
    raise _Refused(f"JSON body contains {name}, which is not JSON; send finite numbers only")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):  # the common case, checked without a Python loop
        return out
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Refused(f"JSON body has the key {key[:80]!r} twice in one object; send it once")
        seen.add(key)
    raise AssertionError("unreachable: fewer keys than pairs means a repeated key")


def _bounded_int(text: str) -> int:
    if len(text) > 20:
        raise _Refused(
            f"JSON body has an integer of {len(text)} digits; integers must be below 2**63 "
            "(send big numbers as strings)"
        )
    value = int(text)
    if not -MAX_INT <= value < MAX_INT:
        raise _Refused(f"JSON integer {value} is outside the 64-bit range; send it as a string")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise _Refused(f"JSON number {text[:40]} is too large for a float; send it as a string")
    return value


# Built once: ``json.loads`` with hooks builds a decoder and its scanner on every call.
# The number hooks are a Python call per number, needed only where a big number may be.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
_DECODER_CHECKING_NUMBERS = json.JSONDecoder(
    object_pairs_hook=_no_duplicates,
    parse_constant=_no_constants,
    parse_int=_bounded_int,
    parse_float=_finite_float,
)


def strict_loads(data: bytes, error: type[InvalidArgument] = InvalidArgument) -> Any:
    """Parse JSON refusing NaN/Infinity, duplicate keys, deep nesting and huge integers."""
    if not _depth_ok(data, MAX_DEPTH):
        raise error(f"JSON body is nested deeper than {MAX_DEPTH} levels; flatten it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"JSON body is not UTF-8: {exc}") from exc
    decoder = _DECODER_CHECKING_NUMBERS if _may_hold_a_big_number(data) else _DECODER
    try:
        return decoder.decode(text)
    except _Refused as exc:
        raise error(str(exc)) from None
    except (ValueError, RecursionError) as exc:
        raise error(f"invalid JSON: the body is not valid JSON ({exc})") from exc


_COMPACT = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
# The same encoder's C core, made once: ``JSONEncoder.encode`` builds it on every call, for
# every job's args (bench/results/ab-0937854-encoder-uuid-array.md). Without cycle markers
# (a dict shared between threads would be): a cycle ends in RecursionError, and
# ``compact`` asks ``_COMPACT``, which names it.
_ENCODE = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, _COMPACT.default, encode_basestring, None, ":", ",", False, False, False
    )
)


def compact(value: Any, *, what: str) -> str:
    """Compact JSON text of ``value`` (no NaN or Infinity), or an ``InvalidArgument`` that
    starts with ``what`` (e.g. "job args must be JSON (...)"). One reusable encoder:
    ``json.dumps`` with options builds a new one on every call."""
    try:
        if _ENCODE is None:  # no C encoder (not CPython)
            return _COMPACT.encode(value)
        try:
            return "".join(_ENCODE(value, 0))
        except RecursionError:  # a cycle (no markers here) or a deep nest: the full
            return _COMPACT.encode(value)  # encoder says which
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


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def stored_loads(data: str | bytes) -> Any:
    """JSON that homing stored (args, results): the C scanner straight away. ``json.loads``
    adds an encoding sniff (on bytes), a decode and two whitespace regex matches per value,
    and psycopg calls it for every grabbed job's ``jsonb`` args (measured with the rest of
    the worker's per-job changes: bench/results/ab-fae75b5-worker-per-job-python.md).
    Anything unusual (spaces around the value, trailing junk, an error) falls back to
    ``json.loads``, which says what is wrong."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        obj, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # raises the decoder's own error
    return obj if end == len(text) else json.loads(text)
