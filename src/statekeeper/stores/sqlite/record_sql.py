"""A `RecordQuery` as a SQLite condition on the ``value`` column (JSON1 functions).

The condition is a prefilter (see `statekeeper.stores.record_query`): it may keep a
record that fails a test, never drops one that passes. So a test is left out whenever
SQLite could answer it differently from the JSON rules:

- a path label that the encoder would escape (``"``, ``\\``, control characters):
  SQLite matches labels against the key's stored, escaped text;
- a string operand holding NUL; and a stored string holding NUL keeps its record for
  every test but ``eq`` and ``in``: SQLite's ``json_extract`` cuts a string at NUL;
- ``ne`` / ``nin`` on a number other than a whole number within 2**53: SQLite reads a
  stored float or a large integer as a double that may round (it never does for an
  integer it keeps as one);
- numbers compared with a margin of 1e-12 of the operand, for the same rounding.

A record whose text is not JSON, or holds no object at ``within``, is always kept.
"""

from __future__ import annotations

import math
from typing import Any, Final

from statekeeper.stores.record_query import RecordQuery, Scalar, ValueTest

__all__ = ["json_path", "query_condition"]

_EXACT_INT: Final = 2**53
_MARGIN: Final = 1e-12
_NUMBER: Final = "{t} IN ('integer', 'real')"
_HAS_NUL: Final = "instr(value -> ?, '\\u0000') > 0"  # the JSON text of the value at the path


def json_path(labels: tuple[str, ...]) -> str | None:
    """The SQLite JSON path of ``labels`` (``$."a"."b"``); None if one cannot be written."""
    for label in labels:
        if any(ch in '"\\' or ord(ch) < 0x20 for ch in label):
            return None
    return "$" + "".join(f'."{label}"' for label in labels)


def query_condition(query: RecordQuery) -> tuple[str, list[Any]]:
    """A SQL condition on ``value`` keeping every record the query may match, and its
    parameters; ``("1", [])`` when no test can be put in SQL."""
    within = json_path(query.within)
    parts: list[str] = []
    params: list[Any] = []
    for test in query.tests:
        path = json_path(query.within + test.path)
        made = None if path is None else _test(test, path)
        if made is not None:
            parts.append(made[0])
            params += made[1]
    if within is None or not parts:
        return "1", []
    # SQLite parses a value once for all the JSON functions of a row (its parse cache),
    # so the guard costs little more than the tests alone.
    guard = "json_valid(value) AND json_type(value, ?) = 'object'"
    return f"(CASE WHEN {guard} THEN {' AND '.join(parts)} ELSE 1 END)", [within, *params]


def _test(test: ValueTest, path: str) -> tuple[str, list[Any]] | None:
    t, x = "json_type(value, ?)", "json_extract(value, ?)"
    if test.op in ("in", "nin"):
        operands = test.operand if isinstance(test.operand, tuple) else ()
        made = [_equal(o, t, x, path, negated=test.op == "nin") for o in operands]
        if test.op == "in":
            if any(m is None for m in made):
                return None
            kept = [m for m in made if m is not None]
            if not kept:
                return "0", []  # in an empty list: nothing matches
            return "(" + " OR ".join(m[0] for m in kept) + ")", [p for m in kept for p in m[1]]
        kept = [m for m in made if m is not None]  # fewer exclusions: still a superset
        if not kept:
            return None
        return "(" + " AND ".join(m[0] for m in kept) + ")", [p for m in kept for p in m[1]]
    operand = test.operand
    if isinstance(operand, tuple):
        return None
    if test.op in ("eq", "ne"):
        return _equal(operand, t, x, path, negated=test.op == "ne")
    return _order(test.op, operand, t, x, path)


def _equal(
    operand: Scalar, t: str, x: str, path: str, *, negated: bool
) -> tuple[str, list[Any]] | None:
    if operand is None:
        sql = (
            f"({t} IS NOT NULL AND {t} != 'null')" if negated else f"({t} IS NULL OR {t} = 'null')"
        )
        return sql, [path, path]
    if isinstance(operand, bool):
        name = "'true'" if operand else "'false'"
        return (f"{t} IS NOT {name}" if negated else f"{t} = {name}"), [path]
    if isinstance(operand, str):
        if "\x00" in operand:
            return None
        if negated:
            sql = f"({_HAS_NUL} OR NOT ({t} IS 'text' AND {x} IS ?))"
            return sql, [path, path, path, operand]
        return f"({t} = 'text' AND {x} = ?)", [path, path, operand]
    if isinstance(operand, int | float):
        if negated:
            if not (isinstance(operand, int) and abs(operand) <= _EXACT_INT):
                return None
            sql = f"NOT ({t} IS 'integer' AND typeof({x}) = 'integer' AND {x} = ?)"
            return sql, [path, path, path, operand]
        return _number("=", operand, t, x, path)
    return None


def _order(op: str, operand: Scalar, t: str, x: str, path: str) -> tuple[str, list[Any]] | None:
    if isinstance(operand, str):
        if "\x00" in operand:
            return None
        sign = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}[op]
        return f"({_HAS_NUL} OR ({t} = 'text' AND {x} {sign} ?))", [path, path, path, operand]
    if isinstance(operand, bool) or not isinstance(operand, int | float):
        return None
    return _number({"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}[op], operand, t, x, path)


def _number(
    sign: str, operand: int | float, t: str, x: str, path: str
) -> tuple[str, list[Any]] | None:
    """A number test: exact on a stored integer (SQLite compares an integer with an
    integer or a float exactly, as Python does), within the margin on a stored float."""
    span = _span(operand)
    if span is None:
        return None
    low, high = span
    loose = {"=": f"{x} BETWEEN ? AND ?", ">": f"{x} >= ?", ">=": f"{x} >= ?"}.get(
        sign, f"{x} <= ?"
    )
    loose_params = {"=": [path, low, high], ">": [path, low], ">=": [path, low]}.get(
        sign, [path, high]
    )
    if isinstance(operand, int) and not -(2**63) <= operand < 2**63:
        return f"({_NUMBER.format(t=t)} AND {loose})", [path, *loose_params]
    sql = (
        f"({_NUMBER.format(t=t)} AND CASE WHEN typeof({x}) = 'integer' THEN {x} {sign} ?"
        f" ELSE {loose} END)"
    )
    return sql, [path, path, path, operand, *loose_params]


def _span(number: int | float) -> tuple[float, float] | None:
    """[number - margin, number + margin] as floats; None if it has no float."""
    try:
        value = float(number)
    except OverflowError:
        return None
    if not math.isfinite(value):
        return None
    margin = abs(value) * _MARGIN + 1e-300
    return value - margin, value + margin
