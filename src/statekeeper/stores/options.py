"""Store URL options: one parser, so every backend reads and refuses them the same way.

`open_store` hands each opener the URL's query string merged with keyword options, as a
``dict[str, str]``. An opener wraps it in `StoreOptions`, takes what it understands with
typed getters, and calls `StoreOptions.done`, which refuses anything left over (a typo
must never be silently ignored).
"""

from __future__ import annotations

from typing import TypeVar

from statekeeper.errors import InvalidInputError
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES
from statekeeper.stores.base import Durability

__all__ = ["StoreOptions"]

T = TypeVar("T", int, float, bool, str)

_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


class StoreOptions:
    """The options of one store URL, taken one by one by the backend that opens it."""

    def __init__(self, scheme: str, options: dict[str, str]) -> None:
        self.scheme = scheme
        self._left = dict(options)

    def take(self, name: str, kind: type[T], default: T, *, positive: bool = False) -> T:
        """The option ``name`` as ``kind`` (or ``default``); `InvalidInputError` if invalid."""
        raw = self._left.pop(name, None)
        if raw is None:
            return default
        try:
            if kind is bool:
                if raw.lower() not in _TRUE + _FALSE:
                    raise ValueError(raw)
                return raw.lower() in _TRUE
            value = kind(raw)
        except ValueError:
            raise InvalidInputError(
                f"{self.scheme} store option {name}={raw!r} is not a valid {kind.__name__}"
            ) from None
        if positive and not value > 0:  # type: ignore[operator]
            raise InvalidInputError(
                f"{self.scheme} store option {name}={raw!r} must be greater than 0"
            )
        return value

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        """The option ``name``, which must be one of ``allowed``."""
        value = self._left.pop(name, default)
        if value not in allowed:
            raise InvalidInputError(f"{name}={value!r} is not one of: {', '.join(allowed)}")
        return value

    def optional(self, name: str) -> str | None:
        """The raw text of option ``name``, or None when it is absent."""
        return self._left.pop(name, None)

    def durability(self) -> Durability:
        """``durability=power|process`` (default power)."""
        allowed = tuple(d.value for d in Durability)
        return Durability(self.choice("durability", allowed, Durability.POWER.value))

    def max_payload_bytes(self) -> int:
        """``max_payload_bytes=<n>``: the largest entry, record or event a store accepts."""
        return self.take("max_payload_bytes", int, DEFAULT_MAX_PAYLOAD_BYTES, positive=True)

    def done(self) -> None:
        """Refuse any option nobody took."""
        if self._left:
            raise InvalidInputError(
                f"unknown {self.scheme} store option(s): {', '.join(sorted(self._left))}"
            )
