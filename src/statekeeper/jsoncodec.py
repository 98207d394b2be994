"""Strict JSON encoding: the only serialisation statekeeper uses on disk and on the wire.

Never pickle. NaN and infinities are refused (they are not JSON), and so is anything
``json`` cannot encode. Sizes are checked here so every backend enforces the same limit.
"""

from __future__ import annotations

import json
from typing import Any

from statekeeper.errors import InvalidPayloadError, PayloadTooLargeError, StoreCorruptError

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "decode_json", "encode_json"]

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
    # len(text) undercounts multi-byte characters; check bytes only when it could matter.
    if len(text) * 4 > limit and len(text.encode()) > limit:
        raise PayloadTooLargeError(
            f"{what} is {len(text.encode())} bytes as JSON; the limit is {limit} bytes "
            "(store large data elsewhere and keep a reference, or raise max_payload_bytes)"
        )
    return text


def decode_json(text: str | bytes, *, what: str = "stored value") -> Any:
    """Decode JSON read from a store; undecodable bytes raise `StoreCorruptError`."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreCorruptError(f"{what} is not valid JSON: {exc}") from exc
