"""Small asyncio helpers that more than one layer needs."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[Any], *, every: float = 0.5) -> None:
    """Cancel ``task`` and wait for it to end, cancelling it again every ``every`` seconds.

    Why again: on Python 3.11, `asyncio.wait_for` (which redis-py uses to send every
    command) drops a cancellation that lands as the operation it waits for completes
    (CPython issue gh-86296), and a loop of such calls then never ends. A later
    cancellation lands at the task's next await. Raises the task's own failure, if any.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every)
    if not task.cancelled() and (error := task.exception()) is not None:
        raise error
