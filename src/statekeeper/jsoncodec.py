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
    "gc_paused",
    "loads",
]

DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

MAX_JSON_DEPTH = 100
"""How deeply a stored JSON document may nest (the decoder stops near 200 levels, and
stores wrap values in a few levels of their own)."""

_CONTAINERS = (dict, list, tuple)


def _too_deep(what: str) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"{what} is nested more than {MAX_JSON_DEPTH} levels deep (or contains itself); "
        f"the limit is {MAX_JSON_DEPTH} levels: flatten it, or store the deep part as a string"
    )


def check_json_shape(value: Any, *, what: str = "value") -> None:
    """Raise `InvalidPayloadError` if ``value`` nests deeper than `MAX_JSON_DEPTH` or has
    a dict key that is not a string. Iterative: never a `RecursionError`."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(what)
        if isinstance(item, dict):
            for key, child in item.items():
                if type(key) is not str:
                    raise InvalidPayloadError(
                        f"{what} has the key {key!r} ({type(key).__name__}); JSON object keys "
                        f"must be strings: use str(key) ({str(key)!r}) if that is what you mean"
                    )
                if isinstance(child, _CONTAINERS):
                    stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item if isinstance(child, _CONTAINERS))


_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_json(value: Any, *, what: str = "value", limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode ``value`` as compact JSON text, or raise a typed error naming ``what``."""
    check_json_shape(value, what=what)
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
    if size > limit:
        raise PayloadTooLargeError(
            f"{what} is {size} bytes as JSON; the limit is {limit} bytes "
            "(store large data elsewhere and keep a reference, or raise max_payload_bytes)"
        )
    return text


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
