"""Openers for the built-in URL schemes: parse the options, build the store."""

from __future__ import annotations

from typing import TypeVar, cast

from statekeeper.errors import InvalidInputError
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES
from statekeeper.stores.base import Durability, Store

__all__ = ["no_more_options", "open_memory", "open_sqlite", "take_option"]

T = TypeVar("T")


def take_option(options: dict[str, str], name: str, kind: type[T], default: T) -> T:
    raw = options.pop(name, None)
    if raw is None:
        return default
    try:
        if kind is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return cast(T, raw.lower() in ("1", "true", "yes"))
        return kind(raw)  # type: ignore[call-arg]
    except ValueError:
        raise InvalidInputError(
            f"store option {name}={raw!r} is not a valid {kind.__name__}"
        ) from None


def no_more_options(options: dict[str, str], scheme: str) -> None:
    if options:
        raise InvalidInputError(f"unknown {scheme} store option(s): {', '.join(sorted(options))}")


async def open_memory(location: str, options: dict[str, str]) -> Store:
    """``memory://``"""
    from statekeeper.stores.memory import MemoryStore

    limit = take_option(options, "max_payload_bytes", int, DEFAULT_MAX_PAYLOAD_BYTES)
    no_more_options(options, "memory")
    return MemoryStore(max_payload_bytes=limit)


async def open_sqlite(location: str, options: dict[str, str]) -> Store:
    """``sqlite:///relative.db`` or ``sqlite:////absolute.db``"""
    from statekeeper.stores.sqlite import SQLiteStore

    path = location[1:] if location.startswith("/") else location
    if not path:
        raise InvalidInputError("sqlite URL needs a path, e.g. sqlite:///state.db")
    durability = options.pop("durability", Durability.POWER.value)
    if durability not in {d.value for d in Durability}:
        raise InvalidInputError(
            f"durability={durability!r} is not one of: {', '.join(d.value for d in Durability)}"
        )
    mode = options.pop("mode", "rw")
    if mode not in ("rw", "ro"):
        raise InvalidInputError(f"mode={mode!r} must be 'rw' or 'ro'")
    busy_timeout = take_option(options, "busy_timeout", float, 30.0)
    limit = take_option(options, "max_payload_bytes", int, DEFAULT_MAX_PAYLOAD_BYTES)
    inline = take_option(options, "inline_writes", bool, True)
    no_more_options(options, "sqlite")
    return await SQLiteStore.open(
        path,
        durability=Durability(durability),
        busy_timeout=busy_timeout,
        read_only=mode == "ro",
        inline_writes=inline,
        max_payload_bytes=limit,
    )
