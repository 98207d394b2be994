"""Retrying an operation that lost a compare-and-set race."""

from __future__ import annotations

import asyncio
import random as _random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from statekeeper.errors import ConflictError, InvalidInputError

__all__ = ["DEFAULT_MAX_BACKOFF", "retry_on_conflict"]

T = TypeVar("T")

DEFAULT_MAX_BACKOFF = 5.0
"""The longest single wait between retries, in seconds, unless ``max_backoff`` says."""


async def retry_on_conflict(
    operation: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    before_retry: Callable[[], Awaitable[object]] | None = None,
    backoff: float = 0.0,
    max_backoff: float = DEFAULT_MAX_BACKOFF,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    random: Callable[[], float] = _random.random,
) -> T:
    """Run ``operation``; on `ConflictError` call ``before_retry`` (e.g. a refresh) and retry.

    ``operation`` must re-read what it depends on each time (it is re-run whole). After
    ``attempts`` conflicts the last `ConflictError` is raised. Between retries it waits
    ``backoff`` seconds, doubling each time up to ``max_backoff``, and jittered to between
    half and all of that (``random`` draws in [0, 1)), so writers that keep colliding
    spread out and none stalls long. ``sleep`` and ``random`` are for tests.
    """
    if attempts < 1:
        raise InvalidInputError(f"attempts must be at least 1 (got {attempts})")
    if backoff < 0 or max_backoff < 0:
        raise InvalidInputError(
            f"backoff and max_backoff are seconds, 0 or more (got {backoff}, {max_backoff})"
        )
    delay = min(backoff, max_backoff)
    for attempt in range(1, attempts + 1):
        try:
            return await operation()
        except ConflictError:
            if attempt == attempts:
                raise
            if before_retry is not None:
                await before_retry()
            if delay > 0:
                await sleep(delay * (0.5 + 0.5 * random()))
                delay = min(delay * 2, max_backoff)
    raise AssertionError("unreachable")
