"""Strict JSON encoding: the only serialisation statekeeper uses on disk and on the wire.

Never pickle. NaN and infinities are refused (they are not JSON), and so is anything
``json`` cannot encode. Sizes are checked here so every backend enforces the same limit.
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

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "decode_json", "encode_json", "gc_paused", "loads"]

DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_json(value: Any, *, what: str = "value", limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode ``value`` as compact JSON text, or raise a typed error naming ``what``."""
    try:
        text = _encoder.encode(value)
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
