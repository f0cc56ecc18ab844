"""Strict JSON (``homing._json``): what it refuses, and its fast paths against the plain
byte-by-byte rules they replace."""

from __future__ import annotations

import json
import random

import pytest

from homing._json import MAX_DEPTH, _depth_ok, compact, stored_loads, strict_loads
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


def _random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.randint(-(2**40), 2**40)
    if kind == 3:
        return rng.uniform(-1e6, 1e6)
    if kind == 4:
        return "".join(
            rng.choice('ab"\\\n\u00e9\u2028\U0001f600 ') for _ in range(rng.randrange(6))
        )
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def test_compact_and_stored_loads_agree_with_the_json_module() -> None:
    """``compact`` (the encoder's C core made once) writes what ``json.dumps`` with the
    same options writes, and ``stored_loads`` (the C scanner) reads back what
    ``json.loads`` reads, from compact text, PostgreSQL's spaced ``jsonb`` text and bytes."""
    rng = random.Random(17)
    for _ in range(2000):
        value = _random_value(rng)
        text = compact(value, what="v")
        assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        spaced = json.dumps(value)
        assert stored_loads(text) == json.loads(text)
        assert stored_loads(spaced) == json.loads(spaced)
        assert stored_loads(spaced.encode()) == json.loads(spaced)


@pytest.mark.parametrize(
    "value, words",
    [
        ({"x": float("nan")}, "Out of range float"),
        ({"x": object()}, "not JSON serializable"),
        ({1, 2}, "not JSON serializable"),
    ],
)
def test_compact_refuses_what_json_cannot_hold(value: object, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        compact(value, what="job args must be JSON")


def test_compact_refuses_a_cycle_with_the_json_modules_message() -> None:
    loop: list[object] = []
    loop.append({"again": loop})
    with pytest.raises(InvalidArgument, match="Circular reference"):
        compact(loop, what="job args must be JSON")


@pytest.mark.parametrize("text", ['{"a": 1} x', "[1,", "", "nul", ' {"a": 1}'])
def test_stored_loads_falls_back_to_json_loads_for_anything_unusual(text: str) -> None:
    try:
        expected: object = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError, match=exc.msg):
            stored_loads(text)
    else:
        assert stored_loads(text) == expected
