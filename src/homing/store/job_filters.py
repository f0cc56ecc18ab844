"""Search filters over a job's JSON args (``where=``), compiled to SQL with bound parameters.

Used by grabs and by the dashboard's args search. Keys and values always travel as
parameters; only the structure of the filter shapes the SQL text."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from homing.errors import InvalidFilter
from homing.store.dialect import SqlDialect

_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,127}$")
_COMPARISONS = {"$lt": "<", "$lte": "<=", "$gt": ">", "$gte": ">="}
_OPERATORS = ("$eq", "$in", *_COMPARISONS)
_MAX_IN = 1000
_INT_RANGE = 2**63


def _check_scalar(key: str, value: Any) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -_INT_RANGE <= value < _INT_RANGE:
            raise InvalidFilter(f"where[{key!r}]: integer {value} is out of the 64-bit range")
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidFilter(f"where[{key!r}]: {value} is not a finite number")
        return
    raise InvalidFilter(
        f"where[{key!r}]: {type(value).__name__} values cannot be searched; "
        "use a string, number, boolean or None"
    )


def _path(key: Any) -> list[str]:
    if not isinstance(key, str):
        raise InvalidFilter(f"where keys must be strings naming an args field, not {key!r}")
    segments = key.split(".")
    for seg in segments:
        if not _SEGMENT.match(seg):
            raise InvalidFilter(
                f"where key {key!r}: each dot-separated part must be a name of letters, "
                "digits, '_' or '-' starting with a letter or '_'"
            )
    return segments


def compile_where(sql: SqlDialect, where: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """Translate a search filter over the JSON args into SQL with bound parameters.

    ``{"user": 5}`` is equality; ``{"n": {"$gte": 3, "$lt": 9}}``, ``{"c": {"$in": [..]}}``
    use operators. Keys are field names, dot-separated for nested objects. Keys and values
    always travel as parameters; only the structure shapes the SQL.
    """
    if not isinstance(where, Mapping):
        raise InvalidFilter(
            f"where must be a dict of field -> value or {{operator: value}}, not {type(where).__name__}"
        )
    if not where:
        raise InvalidFilter("where is empty; pass None to grab without a search")
    clauses: list[str] = []
    params: list[Any] = []
    for key, cond in where.items():
        path = _path(key)
        if isinstance(cond, Mapping):
            if not cond:
                raise InvalidFilter(f"where[{key!r}] is an empty operator dict")
            ops = list(cond.items())
        else:
            ops = [("$eq", cond)]
        for op, value in ops:
            if op not in _OPERATORS:
                raise InvalidFilter(
                    f"where[{key!r}]: unknown operator {op!r}; use one of {', '.join(_OPERATORS)}"
                )
            if op == "$in":
                if not isinstance(value, list | tuple) or not value or len(value) > _MAX_IN:
                    raise InvalidFilter(
                        f"where[{key!r}]: $in takes a non-empty list of at most {_MAX_IN} values"
                    )
                for v in value:
                    _check_scalar(key, v)
                clause, more = sql.json_in(path, value)
                clauses.append(clause)
                params += more
                continue
            _check_scalar(key, value)
            if op == "$eq":
                clause, more = sql.json_eq(path, value)
            else:
                if isinstance(value, bool) or not isinstance(value, int | float | str):
                    raise InvalidFilter(
                        f"where[{key!r}]: {op} compares numbers or strings, not {value!r}"
                    )
                clause, more = sql.json_cmp(path, _COMPARISONS[op], value)
            clauses.append(clause)
            params += more
    return " AND ".join(clauses), params
