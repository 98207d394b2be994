"""A first-come, first-served asyncio lock whose uncontended acquire costs a plain call.

The append engine takes one per write to a session; `asyncio.Lock` makes that a
coroutine (``async with``) even when nobody waits. Here a free lock is taken by setting
a flag (`FifoLock.try_acquire`), and only a writer that must wait awaits anything.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["FifoLock"]


class FifoLock:
    """A lock handed to its waiters in arrival order; cancellation never leaves it held."""

    __slots__ = ("busy", "waiters")

    def __init__(self) -> None:
        self.busy = False
        self.waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        """Take the lock if it is free (without waiting); whether it was taken."""
        if self.busy:
            return False
        self.busy = True
        return True

    async def acquire(self) -> None:
        """Wait until this caller holds the lock."""
        if self.try_acquire():
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed the lock just as we were cancelled: pass it on
            elif turn in self.waiters:  # else a release() already dropped it, unserved
                self.waiters.remove(turn)
            raise

    def release(self) -> None:
        """Hand the lock to the longest waiter still waiting, else free it."""
        while self.waiters:
            turn = self.waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # it holds the lock now: ``busy`` stays set
                return
        self.busy = False
