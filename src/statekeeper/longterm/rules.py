"""The pure rules of the long-term store: names, filters, field paths and vectors.

Nothing here does I/O, so each rule is tested on its own (``tests/longterm``), and the
store in `statekeeper.longterm.store` only reads, writes and composes.

A namespace is a tuple of labels; an item is addressed by (namespace, key). Both are
folded into one record key of the underlying store (its *slot*)::

    ("users", "alice", "prefs") + "theme"      ->  "users.alice.prefs.:theme"
    ("users", "alice", "prefs") + "/notes a"   ->  "users.alice.prefs.::<40 hex digits>"

Every label ends with ``.`` and the key follows ``.:``. Labels start with a letter or digit
and hold no ``.``, so the first ``.:`` ends the namespace: a slot names exactly one
(namespace, key), and every item under a namespace prefix shares the prefix
``"users.alice."``, so a prefix search is one range scan of the record store. A key that
is not a statekeeper id (or would make the slot too long) is stored under a digest,
marked by its leading ``:`` that no id has; the key itself is kept in the item. So any
text is a key, and none can reach a file name or another item.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import operator
import re
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pydantic import JsonValue

from statekeeper.errors import InvalidIdError, InvalidInputError
from statekeeper.ids import MAX_ID_LENGTH, validate_id
from statekeeper.jsoncodec import MAX_JSON_DEPTH

MAX_KEY_LENGTH: Final = 1024
"""The longest key, in characters."""

MAX_NAMESPACE_LENGTH: Final = MAX_ID_LENGTH - 43
"""The longest namespace, in characters with its labels joined by ``.`` (a slot must
fit in an id with a 41-character digest key after the ``.:`` that ends the namespace)."""

__all__ = [
    "COMPARISONS",
    "MAX_KEY_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "OPERATORS",
    "check_filter",
    "check_key",
    "check_label",
    "check_namespace",
    "cosine",
    "json_equal",
    "match_namespace",
    "matches",
    "pack_vector",
    "scope_prefix",
    "slot",
    "slot_namespace",
    "texts_at",
    "unit",
    "unpack_vector",
]

_LABEL_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:@-]*")
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f]")
_WILDCARD: Final = "*"

COMPARISONS: Final = frozenset({"$gt", "$gte", "$lt", "$lte"})
"""Operators that order values: both sides numbers, or both strings; else no match."""

OPERATORS: Final = frozenset({"$eq", "$ne", "$in", "$nin", *COMPARISONS})
"""Every operator a filter may use."""


# -- names -------------------------------------------------------------------------------


def check_label(label: object, *, wildcard: bool = False) -> str:
    """A namespace label: letters, digits, ``_ : @ -``, starting with a letter or digit."""
    if wildcard and label == _WILDCARD:
        return _WILDCARD
    if not isinstance(label, str) or not _LABEL_RE.fullmatch(label):
        shown = repr(label) if isinstance(label, str) else type(label).__name__
        raise InvalidIdError(
            f"namespace label {shown} is not allowed: use letters, digits, '_', ':', '@' "
            "and '-', starting with a letter or digit (no '.', '/' or spaces)"
        )
    return label


def check_namespace(
    namespace: object, *, empty: bool = False, wildcard: bool = False
) -> tuple[str, ...]:
    """A namespace as a tuple of checked labels (a list is accepted too)."""
    if isinstance(namespace, str) or not isinstance(namespace, tuple | list):
        raise InvalidIdError(
            f"a namespace is a tuple of labels such as ('users', 'alice'), "
            f"not {type(namespace).__name__}"
        )
    if not namespace and not empty:
        raise InvalidIdError("a namespace needs at least one label, e.g. ('memories',)")
    return tuple(check_label(label, wildcard=wildcard) for label in namespace)


def check_key(key: object) -> str:
    """An item key: any text of 1 to `MAX_KEY_LENGTH` characters without control characters."""
    if not isinstance(key, str) or not key:
        raise InvalidIdError(f"a memory key is a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH or _CONTROL_RE.search(key):
        raise InvalidIdError(
            f"memory key {key[:40]!r} is not allowed: at most {MAX_KEY_LENGTH} characters, "
            "no control characters"
        )
    return key


def scope_prefix(namespace: tuple[str, ...]) -> str:
    """The slot prefix shared by every item in ``namespace`` or below it."""
    return "".join(f"{label}." for label in namespace)


def slot(namespace: tuple[str, ...], key: str) -> str:
    """The record key of (namespace, key); `InvalidIdError` if the namespace is too long."""
    joined = ".".join(namespace)
    if len(joined) > MAX_NAMESPACE_LENGTH:
        raise InvalidIdError(
            f"namespace {namespace!r} is {len(joined)} characters joined with '.'; the limit "
            f"is {MAX_NAMESPACE_LENGTH} (use fewer or shorter labels)"
        )
    head = f"{joined}.:"
    if len(head) + len(key) <= MAX_ID_LENGTH and _is_id(key):
        return head + key
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=20)
    return f"{head}:{digest.hexdigest()}"


def _is_id(text: str) -> bool:
    try:
        validate_id(text)
    except InvalidIdError:
        return False
    return True


def slot_namespace(text: str) -> tuple[str, ...]:
    """The namespace a slot belongs to; `InvalidIdError` for a foreign record key."""
    head, sep, rest = text.partition(".:")
    if not sep or not rest:
        raise InvalidIdError(f"record key {text!r} is not a long-term memory slot")
    return tuple(head.split("."))


def match_namespace(
    namespace: tuple[str, ...],
    prefix: tuple[str, ...] = (),
    suffix: tuple[str, ...] = (),
) -> bool:
    """Whether ``namespace`` starts with ``prefix`` and ends with ``suffix`` ("*" = any label)."""
    if len(namespace) < max(len(prefix), len(suffix)):
        return False
    pairs = [*zip(namespace, prefix, strict=False)]
    pairs += zip(reversed(namespace), reversed(suffix), strict=False)
    return all(want in (_WILDCARD, have) for have, want in pairs)


# -- filters -----------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_equal(a: object, b: object) -> bool:
    """JSON equality: ``1 == 1.0``, but ``true`` is not ``1``; objects and arrays deeply."""
    if _is_number(a) and _is_number(b):
        return a == b
    if type(a) is not type(b) and not (isinstance(a, list | tuple) and isinstance(b, list | tuple)):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _is_operator_dict(value: object) -> bool:
    return isinstance(value, dict) and any(str(k).startswith("$") for k in value)


def check_filter(filter: object, *, where: str = "filter", depth: int = 1) -> dict[str, Any]:
    """Validate a filter (a dict of field -> value or {operator: value}); return it.

    Nested fields go at most `MAX_JSON_DEPTH` levels deep, as stored values do: a deeper
    filter could match nothing, and is an `InvalidInputError` (never a RecursionError).
    """
    if depth > MAX_JSON_DEPTH:
        raise InvalidInputError(
            f"filter nests fields more than {MAX_JSON_DEPTH} levels deep, deeper than any "
            "stored value can be: flatten it"
        )
    if not isinstance(filter, Mapping):
        raise InvalidInputError(
            f"{where} must be a dict of field -> value, got {type(filter).__name__}"
        )
    for field, want in filter.items():
        if not isinstance(field, str) or field.startswith("$"):
            raise InvalidInputError(
                f"{where} field {field!r} is not allowed: fields are strings; operators "
                f"go inside a field's value, e.g. {{'score': {{'$gt': 3}}}}"
            )
        if _is_operator_dict(want):
            _check_operators(want, where=f"{where}[{field!r}]")
        elif isinstance(want, Mapping):
            check_filter(want, where=f"{where}[{field!r}]", depth=depth + 1)
    return dict(filter)


def _check_operators(ops: Mapping[str, Any], *, where: str) -> None:
    for op, operand in ops.items():
        if op not in OPERATORS:
            raise InvalidInputError(
                f"{where} uses {op!r}: operators are {', '.join(sorted(OPERATORS))} "
                "(and a field's operators may not be mixed with nested fields)"
            )
        if op in ("$in", "$nin") and not isinstance(operand, list | tuple):
            raise InvalidInputError(f"{where}: {op} takes a list of values, got {operand!r}")
        if op in COMPARISONS and not (_is_number(operand) or isinstance(operand, str)):
            raise InvalidInputError(f"{where}: {op} compares with a number or a string")


def _compare(have: object, op: str, want: Any) -> bool:
    if op == "$eq":
        return json_equal(have, want)
    if op == "$ne":
        return not json_equal(have, want)
    if op == "$in":
        return any(json_equal(have, w) for w in want)
    if op == "$nin":
        return not any(json_equal(have, w) for w in want)
    comparable = (_is_number(have) and _is_number(want)) or (
        isinstance(have, str) and isinstance(want, str)
    )
    if not comparable:
        return False  # a missing field or another type never orders
    a: Any = have
    if op == "$gt":
        return bool(a > want)
    if op == "$gte":
        return bool(a >= want)
    if op == "$lt":
        return bool(a < want)
    return bool(a <= want)


def matches(value: object, filter: Mapping[str, Any]) -> bool:
    """Whether a stored value satisfies a (checked) filter: every field must match.

    A field's condition is a value (JSON equality; a dict matches the fields it names,
    a list matches a list of as many items that each match),
    or a dict of operators that must all hold. A missing field is ``None`` to ``$eq`` /
    ``$ne`` / ``$in`` / ``$nin`` and never satisfies a comparison.
    """
    if not isinstance(value, dict):
        return False
    return all(_field_matches(value.get(field), want) for field, want in filter.items())


def _field_matches(have: object, want: Any) -> bool:
    if _is_operator_dict(want):
        return all(_compare(have, op, operand) for op, operand in want.items())
    if isinstance(want, dict):
        return matches(have, want)
    if isinstance(want, list):  # item by item, so a dict in a list matches the fields it names
        return (
            isinstance(have, list)
            and len(have) == len(want)
            and all(_field_matches(h, w) for h, w in zip(have, want, strict=True))
        )
    return json_equal(have, want)


# -- field paths and vectors -------------------------------------------------------------

_STEP_RE: Final = re.compile(r"([^.\[\]]+)|\[(\*|-?\d+)\]")


def _steps(path: str) -> list[str | int | None]:
    steps: list[str | int | None] = []
    for part in path.split("."):
        found = _STEP_RE.findall(part)
        if not part or "".join(n or f"[{i}]" for n, i in found) != part:
            raise InvalidInputError(
                f"field path {path!r} is not valid: use names joined by '.', with "
                "'[n]' or '[*]' for list items, e.g. 'notes[*].text', or '$' for the value"
            )
        steps += [n if n else (None if i == "*" else int(i)) for n, i in found]
    return steps


def texts_at(value: JsonValue, path: str) -> list[str]:
    """The texts to embed at ``path`` of ``value`` (``$`` is the whole value as JSON).

    A string is taken as is; a number, bool or a nested object as its JSON text.
    """
    current: list[Any] = [value]
    if path != "$":
        for step in _steps(path):
            current = [v for node in current for v in _step(node, step)]
    return [
        c if isinstance(c, str) else json.dumps(c, sort_keys=True) for c in current if c is not None
    ]


def _step(node: Any, step: str | int | None) -> list[Any]:
    if isinstance(step, str):
        return [node[step]] if isinstance(node, dict) and step in node else []
    if not isinstance(node, list):
        return []
    if step is None:
        return list(node)
    return [node[step]] if -len(node) <= step < len(node) else []


def pack_vector(vector: Sequence[float]) -> str:
    """A unit-length copy of ``vector`` as base64 float32 text (JSON-safe, 4 bytes each)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    scaled = array("f", (x / norm for x in vector) if norm else vector)
    return base64.b64encode(scaled.tobytes()).decode("ascii")


def unpack_vector(text: str) -> array[float]:
    """The vector `pack_vector` wrote."""
    out = array("f")
    out.frombytes(base64.b64decode(text, validate=True))
    return out


_SUMPROD: Final = getattr(math, "sumprod", None)  # Python 3.12+: a C loop, ~10x faster


def cosine(query: Sequence[float], stored: Sequence[float]) -> float | None:
    """Cosine similarity of two unit-length vectors; None if their sizes differ."""
    if len(query) != len(stored):
        return None
    if _SUMPROD is not None:
        return float(_SUMPROD(query, stored))
    return float(sum(map(operator.mul, query, stored)))


def unit(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1 (a zero vector stays zero)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [float(x) / norm for x in vector] if norm else [float(x) for x in vector]
