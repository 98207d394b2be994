"""Strict JSON encoding: the only serialisation statekeeper uses on disk and on the wire.

Never pickle. NaN and infinities are refused (they are not JSON), and so is anything
``json`` cannot encode: dict keys that are not strings (``json`` would silently turn
``{1: "x"}`` into ``{"1": "x"}``) and values nested deeper than `MAX_JSON_DEPTH` (the
reader refuses them, so they would be stored and never read back). Sizes are checked
here so every backend enforces the same limit.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pydantic_core

from statekeeper.errors import InvalidPayloadError, PayloadTooLargeError, StoreCorruptError

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_JSON_DEPTH",
    "check_json_shape",
    "decode_json",
    "encode_json",
    "encode_stored",
    "gc_paused",
    "loads",
]

DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

MAX_JSON_DEPTH = 100
"""How deeply a stored JSON document may nest (the decoder stops near 200 levels, and
stores wrap values in a few levels of their own)."""


def _too_deep(what: str) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"{what} is nested more than {MAX_JSON_DEPTH} levels deep (or contains itself); "
        f"the limit is {MAX_JSON_DEPTH} levels: flatten it, or store the deep part as a string"
    )


def check_json_shape(value: Any, *, what: str = "value") -> None:
    """Raise `InvalidPayloadError` if ``value`` nests deeper than `MAX_JSON_DEPTH` or has
    a dict key that is not a string. Iterative: never a `RecursionError`."""
    _walk(value, what)


_PLAIN = frozenset({str, int, bool, type(None)})


def _walk(value: Any, what: str) -> bool:
    """`check_json_shape`, and whether ``value`` is *plain*: only dicts, lists, str, int,
    bool, None and finite floats, of exactly those types (no tuples, no subclasses such
    as enums). Plain data reads back from its JSON equal and of the same types."""
    plain = True
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(what)
        kind = type(item)
        if kind is dict:
            children: Any = item.values()
            for key in item:
                if type(key) is not str:
                    raise InvalidPayloadError(
                        f"{what} has the key {key!r} ({type(key).__name__}); JSON object keys "
                        f"must be strings: use str(key) ({str(key)!r}) if that is what you mean"
                    )
        elif kind is list:
            children = item
        elif kind in _PLAIN or (kind is float and math.isfinite(item)):
            continue
        else:
            plain = False
            if isinstance(item, dict):
                if any(type(key) is not str for key in item):
                    _walk(dict(item), what)  # raises, naming the key
                children = item.values()
            elif isinstance(item, list | tuple):
                children = item
            else:
                continue  # the encoder decides (and refuses what is not JSON)
        for child in children:
            if type(child) in _PLAIN:
                continue
            stack.append((child, depth + 1))
    return plain


_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_json(value: Any, *, what: str = "value", limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode ``value`` as compact JSON text, or raise a typed error naming ``what``."""
    return _encode(value, what, limit)[0]


def encode_stored(
    value: Any, *, what: str = "value", limit: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> tuple[str, Any]:
    """``value`` as compact JSON text, and the value as it reads back from that text.

    Plain data (see `_walk`) reads back equal to itself, so it is returned as is and
    encoded by pydantic-core in one native pass; anything else (tuples, enums, ...) goes
    through ``json`` and is decoded again, so callers hold exactly what a read returns.
    """
    text, plain = _encode(value, what, limit)
    return text, value if plain else loads(text)


def _encode(value: Any, what: str, limit: int) -> tuple[str, bool]:
    if _walk(value, what):
        try:
            data = pydantic_core.to_json(value)
        except pydantic_core.PydanticSerializationError as exc:  # a lone surrogate
            raise InvalidPayloadError(f"{what} is not valid UTF-8 text: {exc}") from exc
        _check_size(len(data), what, limit)
        return data.decode(), True
    try:
        text = _encoder.encode(value)
    except RecursionError:
        raise _too_deep(what) from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(
            f"{what} is not plain JSON ({exc}); store only dicts, lists, str, int, "
            "finite float, bool and None"
        ) from exc
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise InvalidPayloadError(
            f"{what} contains a lone surrogate ({exc.reason}); it is not valid UTF-8 text"
        ) from exc
    _check_size(size, what, limit)
    return text, False


def _check_size(size: int, what: str, limit: int) -> None:
    if size > limit:
        raise PayloadTooLargeError(
            f"{what} is {size} bytes as JSON; the limit is {limit} bytes "
            "(store large data elsewhere and keep a reference, or raise max_payload_bytes)"
        )


loads = partial(pydantic_core.from_json, allow_inf_nan=False)
"""Strict, fast JSON decoding (raises ValueError on anything that is not JSON)."""


def decode_json(text: str | bytes, *, what: str = "stored value") -> Any:
    """Decode JSON read from a store; undecodable bytes raise `StoreCorruptError`."""
    try:
        return loads(text)
    except ValueError as exc:
        raise StoreCorruptError(f"{what} is not valid JSON: {exc}") from exc


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while decoding many acyclic objects.

    Decoding 10,000 messages allocates tens of thousands of containers, which triggers
    repeated full collections that double the cost; none of these objects form cycles,
    so postponing collection loses nothing. Only wraps loops that run no user code.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
