"""The one place that checks the ``openai-agents`` extra, and a cancel-safe await."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from statekeeper.errors import MissingExtraError

__all__ = ["require_sdk", "settled"]

_T = TypeVar("_T")


def require_sdk() -> None:
    """Raise `MissingExtraError` (naming the extra) when the SDK is not installed."""
    try:
        import agents  # noqa: F401
    except ImportError:
        raise MissingExtraError("the OpenAI Agents SDK adapter", "openai-agents") from None


async def settled(awaitable: Awaitable[_T]) -> _T:
    """Await a write to its end even if the caller is cancelled meanwhile.

    A cancelled caller must still learn whether the write happened: the write runs on
    as a task, its outcome (result or error) is kept, and the cancellation is raised
    only after it, so "cancelled" never hides a half-known write.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        task.exception()  # retrieved, so an error of the write is not reported as lost
        raise cancelled
    return task.result()
