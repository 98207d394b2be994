"""Retrying an operation that lost a compare-and-set race."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from statekeeper.errors import ConflictError

__all__ = ["retry_on_conflict"]

T = TypeVar("T")


async def retry_on_conflict(
    operation: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    before_retry: Callable[[], Awaitable[object]] | None = None,
    backoff: float = 0.0,
) -> T:
    """Run ``operation``; on `ConflictError` call ``before_retry`` (e.g. a refresh) and retry.

    ``operation`` must re-read what it depends on each time (it is re-run whole). After
    ``attempts`` conflicts the last `ConflictError` is raised. ``backoff`` seconds, with
    jitter and doubling, spread out writers that keep colliding.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            return await operation()
        except ConflictError:
            if attempt == attempts:
                raise
            if before_retry is not None:
                await before_retry()
            if delay > 0:
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay *= 2
    raise AssertionError("unreachable")
