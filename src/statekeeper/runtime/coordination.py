"""Coordination across processes: the contracts backends implement, and the bus bridge.

Two protocols, implemented by the Redis and PostgreSQL backends
(`statekeeper.stores.redis.coordination`, `statekeeper.stores.postgres.coordination`)
and by anything else that keeps them:

- `SessionLocks`: one holder at a time per (tenant, session), whatever process or machine
  it runs in; a holder that dies loses its lock. ``async with locks.hold(tenant,
  session_id, wait=10) as held`` waits up to ``wait`` seconds, else raises
  `SessionLockTimeoutError`; ``await held.check()`` raises `SessionLockLostError` once the
  lock is known to be lost. `Runner(session_locks=...)` takes any of them.
- `EventFeed`: `EventNotice` s of event appends made by any process, as they commit.

`feed_bus` keeps an `EventBus` live from any feed: each notice makes the bus's
subscribers of that run read the new events from the log (in order, without gap or
repeat, as every read of the log does).

Layering: the runtime imports no backend, and no backend imports the runtime (a backend
implements a protocol by its shape). What both sides name lives below them and is
re-exported here: the errors in `statekeeper.errors`, `EventNotice` in
`statekeeper.stores.types`, `cancel_and_wait` in `statekeeper.tasks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from statekeeper.errors import SessionLockLostError, SessionLockTimeoutError, StatekeeperError
from statekeeper.stores.base import EventNotice
from statekeeper.tasks import cancel_and_wait

if TYPE_CHECKING:  # the bus is only called, never built, here
    from statekeeper.runtime.events import EventBus

__all__ = [
    "EventFeed",
    "EventNotice",
    "HeldLock",
    "SessionLockLostError",
    "SessionLockTimeoutError",
    "SessionLocks",
    "cancel_and_wait",
    "feed_bus",
]

_log = logging.getLogger(__name__)


# -- session locks -------------------------------------------------------------------------


@runtime_checkable
class HeldLock(Protocol):
    """A session lock being held (what `SessionLocks.hold` yields)."""

    @property
    def tenant(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    async def check(self) -> None:
        """Raise `SessionLockLostError` if the lock is known to be lost.

        A lock can end while its holder still runs (a pause past a lease's expiry, a
        dropped connection): check before a write that must not race a new holder.
        """
        ...


@runtime_checkable
class SessionLocks(Protocol):
    """Per-session mutual exclusion across processes and machines."""

    def hold(
        self, tenant: str, session_id: str, *, wait: float | None = None
    ) -> AbstractAsyncContextManager[HeldLock]:
        """Hold the session's lock for an ``async with`` block, and release it after.

        Waits up to ``wait`` seconds (None: as long as it takes; 0: only if free now),
        then raises `SessionLockTimeoutError`. Not reentrant: holding it again inside the
        block waits for itself. A negative ``wait`` raises `InvalidInputError`
        (`statekeeper.stores.rules.check_wait`, for backends).
        """
        ...


# -- event feeds ---------------------------------------------------------------------------


@runtime_checkable
class EventFeed(Protocol):
    """Notices of event appends committed by any process on one store."""

    def notices(self, tenant: str) -> AsyncIterator[EventNotice]:
        """The tenant's notices, forever (stop iterating, or cancel, to stop).

        The first notice is a resync, sent once the feed listens: every append that
        commits after it is noticed. A lost connection is reopened, then a resync sent.
        Raises `StoreUnavailableError` only if the first connection fails.
        """
        ...


@contextlib.asynccontextmanager
async def feed_bus(bus: EventBus, feed: EventFeed) -> AsyncIterator[EventBus]:
    """Keep ``bus`` live with other processes' events while the block runs.

    Entering returns once the feed listens, so what other processes publish from then on
    reaches the bus's run subscribers without polling. Every notice refreshes its run
    (a resync: every run). A failure of the feed is logged at once and raised on exit.
    """
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    pump = asyncio.create_task(_pump(bus, feed, ready), name=f"statekeeper-feed:{bus.tenant}")
    pump.add_done_callback(lambda task: _fail(ready, task))
    try:
        await asyncio.shield(ready)  # the pump, not this wait, owns the future
        yield bus
    finally:
        ready.cancel()  # no-op once set; else nobody will read it
        await cancel_and_wait(pump)  # raises the feed's failure, if it failed


async def _pump(bus: EventBus, feed: EventFeed, ready: asyncio.Future[None]) -> None:
    notices = feed.notices(bus.tenant)
    try:
        async for notice in notices:
            if notice.tenant == bus.tenant:  # a feed should not send others: cheap check
                bus.refresh(notice.log_id)
            if not ready.done():
                ready.set_result(None)
    except Exception:
        _log.exception("the event feed of tenant %r failed; the bus is not live", bus.tenant)
        raise
    finally:
        aclose = getattr(notices, "aclose", None)  # an async generator: end it now, not at GC
        if aclose is not None:
            await aclose()


def _fail(ready: asyncio.Future[None], pump: asyncio.Task[None]) -> None:
    """Wake `feed_bus`'s entry when the pump ends before the feed listens."""
    if not ready.done():
        error = None if pump.cancelled() else pump.exception()
        ready.set_exception(error or StatekeeperError("the event feed ended before it listened"))
