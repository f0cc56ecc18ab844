"""Strict JSON (``homing._json``): what it refuses, and its fast paths against the plain
byte-by-byte rules they replace."""

from __future__ import annotations

import json
import random

import pytest

from homing._json import MAX_DEPTH, _depth_ok, strict_loads
from homing.errors import InvalidArgument


def _depth_ok_by_bytes(data: bytes, limit: int) -> bool:
    """The reference: one step a byte, strings and escapes followed."""
    depth, in_str, esc = 0, False, False
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


@pytest.mark.parametrize("seed", range(5))
def test_the_depth_check_agrees_with_the_byte_scan(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = b'[]{}"\\ax,:\n\xc3\xa9'
    for _ in range(4000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        for limit in (0, 1, 2, 3, 5):
            assert _depth_ok(data, limit) == _depth_ok_by_bytes(data, limit), (data, limit)


def test_brackets_inside_strings_do_not_count() -> None:
    inside = b'{"k": "' + b"[" * 500 + b'"}'
    assert _depth_ok(inside, MAX_DEPTH)
    assert strict_loads(inside) == {"k": "[" * 500}
    escaped = b'["\\"' + b"[" * 100 + b'"]'
    assert _depth_ok(escaped, MAX_DEPTH)
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    with pytest.raises(InvalidArgument, match="nested deeper"):
        strict_loads(deep)
    just = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert strict_loads(just) is not None


def test_duplicate_keys_are_refused_at_any_depth() -> None:
    with pytest.raises(InvalidArgument, match="'a' twice"):
        strict_loads(b'{"a": 1, "b": 2, "a": 3}')
    with pytest.raises(InvalidArgument, match="'x' twice"):
        strict_loads(b'{"outer": [{"y": 1, "x": 1, "x": 1}]}')
    assert strict_loads(b'{"a": {"a": 1}, "b": [{"a": 2}]}') == {"a": {"a": 1}, "b": [{"a": 2}]}


INT_REFUSED = "64-bit|digits"
FLOAT_REFUSED = "too large for a float"


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("9223372036854775807", None),  # 2**63 - 1: 19 digits, checked
        ("-9223372036854775808", None),
        ("9223372036854775808", INT_REFUSED),
        ("-9223372036854775809", INT_REFUSED),
        ("999999999999999999", None),  # 18 digits: the fast path
        ("123456789012345678901234567890", INT_REFUSED),
        ("1.2345678901234567890123", None),  # a float's long run of digits is no integer
        ("1e308", None),
        ("-1.7976931348623157e308", None),
        ("1e999", FLOAT_REFUSED),  # json.loads makes it inf
        ("-1E+400", FLOAT_REFUSED),
        ("1" * 400 + ".5", FLOAT_REFUSED),
        ("0." + "0" * 400 + "1", None),  # underflows to 0.0: finite
        ("123456789012345678.9e99", None),
        ("1e-400", None),  # underflows to 0.0: finite
    ],
)
def test_numbers_must_fit_64_bit_integers_and_finite_floats(text: str, refused: str | None) -> None:
    body = ('{"n": ' + text + ', "m": [1, 2, 3]}').encode()
    if refused is None:
        assert strict_loads(body) == json.loads(body)
    else:
        with pytest.raises(InvalidArgument, match=refused):
            strict_loads(body)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_are_refused(constant: str) -> None:
    with pytest.raises(InvalidArgument, match="not JSON"):
        strict_loads(f'{{"x": {constant}}}'.encode())


def test_ordinary_bodies_parse_as_json_does() -> None:
    rng = random.Random(7)
    for _ in range(300):
        value = {
            f"k{i}": rng.choice([rng.randrange(-(10**17), 10**17), "s\u00e9[{", None, True, 1.5])
            for i in range(rng.randrange(0, 8))
        }
        data = json.dumps({"v": value, "l": [value, [value]]}).encode()
        assert strict_loads(data) == json.loads(data)
