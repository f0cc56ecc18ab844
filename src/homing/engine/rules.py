"""Match rules: which messages a selector takes, decided from the message headers.

A rule is a dict of header name -> condition. A condition is a plain value (equality) or a
dict of operators, all of which must hold:

    {"color": True}                          header "color" is exactly true
    {"pages": {"$gt": 0, "$lte": 50}}        comparisons (numbers with numbers, text with text)
    {"tray": {"$in": ["A4", "A3"]}}          one of several values ($nin: none of them)
    {"duplex": {"$exists": False}}           the header is absent

``{}`` matches every message. Rules are validated when a selector is bound (a malformed
rule is refused with ``InvalidRule``) and evaluated in Python, never turned into SQL.
Booleans are not numbers here: ``{"n": 1}`` does not match ``n: true``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from homing.errors import InvalidFilter

OPERATORS = ("$eq", "$ne", "$in", "$nin", "$lt", "$lte", "$gt", "$gte", "$exists")
MAX_RULE_BYTES = 16 * 1024
MAX_IN = 1000
_MAX_KEY = 200


class InvalidRule(InvalidFilter):
    """A selector's match rule is malformed; the selector was not bound."""


def _check_scalar(key: str, value: Any) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise InvalidRule(f"match[{key!r}]: integer {value} is out of the 64-bit range")
        return
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise InvalidRule(f"match[{key!r}]: {value} is not a finite number")
        return
    raise InvalidRule(
        f"match[{key!r}]: {type(value).__name__} values cannot be matched; "
        "use a string, number, boolean or null"
    )


def validate(rule: Any) -> dict[str, Any]:
    """Check a rule and return it as a plain dict; raise ``InvalidRule`` saying what is wrong."""
    if rule is None:
        return {}
    if not isinstance(rule, Mapping):
        raise InvalidRule(
            f"a match rule is a dict of header -> value or {{operator: value}}, "
            f"not {type(rule).__name__}"
        )
    out: dict[str, Any] = {}
    for key, cond in rule.items():
        if not isinstance(key, str) or not key or len(key) > _MAX_KEY:
            raise InvalidRule(
                f"match keys are header names (1..{_MAX_KEY} characters), not {key!r}"
            )
        if key.startswith("$"):
            raise InvalidRule(
                f"match key {key!r} looks like an operator; operators go inside a header's "
                'condition, e.g. {"pages": {"$gt": 3}}'
            )
        if isinstance(cond, Mapping):
            if not cond:
                raise InvalidRule(f"match[{key!r}] is an empty operator dict")
            for op, value in cond.items():
                _check_operator(key, op, value)
            out[key] = dict(cond)
        else:
            _check_scalar(key, cond)
            out[key] = cond
    if len(json.dumps(out)) > MAX_RULE_BYTES:
        raise InvalidRule(f"the match rule is over {MAX_RULE_BYTES} bytes; simplify it")
    return out


def _check_operator(key: str, op: Any, value: Any) -> None:
    if op not in OPERATORS:
        raise InvalidRule(
            f"match[{key!r}]: unknown operator {op!r}; use one of {', '.join(OPERATORS)}"
        )
    if op in ("$in", "$nin"):
        if not isinstance(value, list | tuple) or not value or len(value) > MAX_IN:
            raise InvalidRule(
                f"match[{key!r}]: {op} takes a non-empty list of at most {MAX_IN} values"
            )
        for v in value:
            _check_scalar(key, v)
    elif op == "$exists":
        if not isinstance(value, bool):
            raise InvalidRule(f"match[{key!r}]: $exists takes true or false, not {value!r}")
    elif op in ("$lt", "$lte", "$gt", "$gte"):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise InvalidRule(f"match[{key!r}]: {op} compares numbers or strings, not {value!r}")
        _check_scalar(key, value)
    else:
        _check_scalar(key, value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return "other"


def _eq(a: Any, b: Any) -> bool:
    return _kind(a) == _kind(b) != "other" and a == b


def _cmp(op: str, a: Any, b: Any) -> bool:
    ka = _kind(a)
    if ka not in ("number", "text") or ka != _kind(b):
        return False
    if op == "$lt":
        return bool(a < b)
    if op == "$lte":
        return bool(a <= b)
    if op == "$gt":
        return bool(a > b)
    return bool(a >= b)


_MISSING = object()


def _holds(op: str, expected: Any, actual: Any) -> bool:
    if op == "$exists":
        return (actual is not _MISSING) is expected
    if actual is _MISSING:
        return op in ("$ne", "$nin")
    if op == "$eq":
        return _eq(actual, expected)
    if op == "$ne":
        return not _eq(actual, expected)
    if op == "$in":
        return any(_eq(actual, v) for v in expected)
    if op == "$nin":
        return not any(_eq(actual, v) for v in expected)
    return _cmp(op, actual, expected)


def matches(rule: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """True if every condition of a validated ``rule`` holds for ``headers``."""
    for key, cond in rule.items():
        actual = headers.get(key, _MISSING)
        if isinstance(cond, Mapping):
            if not all(_holds(op, v, actual) for op, v in cond.items()):
                return False
        elif not _holds("$eq", cond, actual):
            return False
    return True
