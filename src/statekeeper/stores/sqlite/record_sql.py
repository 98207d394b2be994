"""A `RecordQuery` as a SQLite condition on the ``value`` column (JSON1 functions).

The condition is a prefilter (see `statekeeper.stores.record_query`): it may keep a
record that fails a test, never drops one that passes. Each test reads its field once
(``json_extract``; SQLite parses a row's JSON once for all the calls on it) and is
written to be NULL exactly when the field is null or missing; only then is the JSON
rule for a missing field applied, and, when that rule would drop the record, whether
the record holds an object at ``within`` at all (a record that does not is kept, for
the caller to report). A test is loosened or left out where SQLite could answer
differently from the JSON rules:

- a path label the encoder would escape (``"``, ``\\``, control characters): SQLite
  matches labels against a key's stored, escaped text;
- a string operand holding NUL (``json_extract`` cuts a string at NUL), and a stored
  string holding NUL keeps its record for ``ne`` and ``gt`` / ``gte``;
- numbers are compared within a margin of 1e-12 of the operand (SQLite reads a stored
  float or a large integer as a double that may round), and ``ne`` / ``nin`` exclude
  only whole numbers within 2**53 stored as integers;
- booleans read as 1 and 0 and an array or object as its JSON text: they may pass a
  number or a string test (the caller's check drops them).
"""

from __future__ import annotations

import math
from typing import Any, Final

from statekeeper.stores.record_query import RecordQuery, Scalar, ValueTest

__all__ = ["guarded", "json_path", "query_condition"]

_EXACT_INT: Final = 2**53
_MARGIN: Final = 1e-12
_X: Final = "json_extract(value, ?)"
_T: Final = "nullif(json_type(value, ?), 'null')"
_HAS_NUL: Final = "instr(value -> ?, '\\u0000') > 0"  # the field's JSON text has a NUL
_Part = tuple[str, list[Any]]


def json_path(labels: tuple[str, ...]) -> str | None:
    """The SQLite JSON path of ``labels`` (``$."a"."b"``); None if one cannot be written."""
    for label in labels:
        if any(ch in '"\\' or ord(ch) < 0x20 for ch in label):
            return None
    return "$" + "".join(f'."{label}"' for label in labels)


def query_condition(query: RecordQuery) -> tuple[str, list[Any]]:
    """A SQL condition on ``value`` keeping every record the query may match, and its
    parameters; ``("1", [])`` when no test can be put in SQL. It raises SQLite's
    "malformed JSON" on a record that is not JSON: see `guarded`."""
    within = json_path(query.within)
    if within is None:
        return "1", []
    parts: list[str] = []
    params: list[Any] = []
    for test in query.tests:
        path = json_path(query.within + test.path)
        core = None if path is None else _core(test, path)
        if core is None:
            continue
        if _on_null(test):
            parts.append(f"coalesce({core[0]}, 1)")
            params += core[1]
        else:
            parts.append(f"coalesce({core[0]}, json_type(value, ?) IS NOT 'object')")
            params += [*core[1], within]
    if not parts:
        return "1", []
    return "(" + " AND ".join(parts) + ")", params


def guarded(condition: str) -> str:
    """``condition`` that keeps a record that is not JSON instead of failing on it."""
    return f"(CASE WHEN json_valid(value) THEN {condition} ELSE 1 END)"


def _on_null(test: ValueTest) -> bool:
    """The JSON rule for a null or missing field (it equals only null)."""
    if test.op in ("eq", "ne"):
        return (test.operand is None) == (test.op == "eq")
    if test.op in ("in", "nin"):
        listed = isinstance(test.operand, tuple) and None in test.operand
        return listed == (test.op == "in")
    return False


def _core(test: ValueTest, path: str) -> _Part | None:
    """The test on a present, non-null field: NULL when the field is null or missing."""
    operand = test.operand
    if test.op in ("in", "nin"):
        operands = operand if isinstance(operand, tuple) else ()
        return _listed(operands, path, negated=test.op == "nin")
    if isinstance(operand, tuple):
        return None
    if test.op in ("eq", "ne"):
        return _equal(operand, path, negated=test.op == "ne")
    return _order(test.op, operand, path)


def _listed(operands: tuple[Scalar, ...], path: str, *, negated: bool) -> _Part | None:
    if not operands:  # nothing is in an empty list, and nothing is excluded by it
        return None if negated else (f"(CASE WHEN {_X} IS NULL THEN NULL ELSE 0 END)", [path])
    made = [_equal(o, path, negated=negated) for o in operands]
    if negated:  # fewer exclusions keep more records: still a prefilter
        kept = [m for m in made if m is not None]
        if not kept:
            return None
    elif any(m is None for m in made):
        return None
    else:
        kept = [m for m in made if m is not None]
    joint = " AND " if negated else " OR "
    return "(" + joint.join(m[0] for m in kept) + ")", [p for m in kept for p in m[1]]


def _equal(operand: Scalar, path: str, *, negated: bool) -> _Part | None:
    if operand is None:  # a present, non-null field is never null
        return f"(CASE WHEN {_X} IS NULL THEN NULL ELSE {int(negated)} END)", [path]
    if isinstance(operand, bool):
        name = "'true'" if operand else "'false'"
        return f"({_T} {'!=' if negated else '='} {name})", [path]
    if isinstance(operand, str):
        if "\x00" in operand:
            return None
        if negated:  # an equal text may be an array's JSON or a string cut at NUL
            sql = f"({_X} != ? OR json_type(value, ?) != 'text' OR {_HAS_NUL})"
            return sql, [path, operand, path, path]
        return f"({_X} = ?)", [path, operand]
    if negated:
        if not (isinstance(operand, int) and abs(operand) <= _EXACT_INT):
            return None
        return f"({_X} != ? OR json_type(value, ?) != 'integer')", [path, operand, path]
    span = _span(operand)
    if span is None:
        return None
    return f"({_X} BETWEEN ? AND ?)", [path, *span]


def _order(op: str, operand: Scalar, path: str) -> _Part | None:
    if isinstance(operand, str):
        if "\x00" in operand:
            return None
        if op in ("lt", "lte"):  # texts from '' up (numbers sort before any text)
            return f"({_X} BETWEEN '' AND ?)", [path, operand]
        sign = ">" if op == "gt" else ">="
        sql = f"({_X} {sign} ? OR ({_X} >= '' AND {_HAS_NUL}))"
        return sql, [path, operand, path, path]
    if isinstance(operand, bool) or not isinstance(operand, int | float):
        return None
    span = _span(operand)
    if span is None:
        return None
    low, high = span
    if op in ("gt", "gte"):  # up to infinity: a text (it sorts after numbers) fails
        return f"({_X} BETWEEN ? AND ?)", [path, low, math.inf]
    return f"({_X} BETWEEN ? AND ?)", [path, -math.inf, high]


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
