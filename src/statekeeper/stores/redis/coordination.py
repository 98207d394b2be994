"""Coordination across processes on Redis: session leases with fencing, and event feeds.

Both implement the protocols of `statekeeper.runtime.coordination`: `RedisLeases` is a
`SessionLocks`, `RedisEventFeed` an `EventFeed` (keep an `EventBus` live from it with
`statekeeper.runtime.coordination.feed_bus`).

**Leases** (`RedisLeases`) keep one worker at a time on a session, whatever process or
machine it runs in: ``async with leases.hold(tenant, session_id, ttl=30, wait=10) as
lease``. Taking a lease sets its key only if absent, with an expiry of ``ttl`` (SET NX
PX), and gives it the session's next *fencing token* (INCR of a counter that only ever
grows), in one script. While held, the lease is renewed every ``ttl / 3``; it is
released on exit by a compare-and-delete that only removes the key if it still holds
this holder's token, so a holder whose lease expired can never release its successor's.
A worker that dies stops renewing, and its lease expires after at most ``ttl``.

A lease is a promise about time, so it can end while its holder still runs (a pause
longer than ``ttl``, a network partition). `Lease.lost` turns true when renewal fails,
and `Lease.check` raises `LeaseLostError`; the fencing token is the real guard: writes
that carry it can be refused when a later holder's token was seen (store the highest
token seen next to the data and compare-and-set on it).

**Event feeds** (`RedisEventFeed`) deliver events written by other processes. A run's
event log is a Redis stream whose entry ids are ``<seq>-0``, so `RedisEventFeed.follow`
resumes from any seq with XREAD: every later event, in order, once, with no gap, blocking
while there is nothing new. `RedisEventFeed.notices` follows a tenant's capped notice
stream (one notice per appended batch: log id, first and last seq) to learn which logs
grew, for followers of every run; a notice stream keeps about
`statekeeper.stores.redis.records.EVENT_NOTICES_KEPT` notices, so per-run completeness
comes from `follow` (or the bus's reads of the log), not from the notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statekeeper.errors import (
    InvalidInputError,
    SessionLockLostError,
    SessionLockTimeoutError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from statekeeper.ids import validate_id
from statekeeper.stores.base import Event, EventNotice
from statekeeper.stores.redis.base import decode_event, run_script, to_text, translate
from statekeeper.stores.redis.keys import Keys
from statekeeper.stores.redis.scripts import Script
from statekeeper.stores.redis.store import RedisStore
from statekeeper.stores.redis.wire import CLIENT_ERRORS
from statekeeper.stores.rules import check_record_ids, check_tenant_and_id, check_wait
from statekeeper.tasks import cancel_and_wait

__all__ = [
    "Lease",
    "LeaseBusyError",
    "LeaseLostError",
    "RedisEventFeed",
    "RedisLeases",
]

logger = logging.getLogger(__name__)


class LeaseBusyError(SessionLockTimeoutError):
    """Another holder kept the session's lease for longer than the caller would wait."""

    def __init__(self, session_id: str, waited: float, remaining_ms: int) -> None:
        super().__init__(
            session_id,
            waited,
            f" (its lease expires in {max(remaining_ms, 0) / 1000:.1f}s unless renewed)",
        )
        self.remaining_ms = remaining_ms


class LeaseLostError(SessionLockLostError):
    """The lease expired or was taken over while its holder still ran."""

    def __init__(self, session_id: str, fence: int) -> None:
        super().__init__(session_id, f" (lease fence {fence}): renewal failed before it expired")
        self.fence = fence


_ACQUIRE = Script(
    "lease_acquire",
    """
-- KEYS: lease, fence counter;  ARGV: holder, ttl ms
-- Returns {1, fence} taken; {0, remaining ms} held by another.
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('PTTL', KEYS[1])} end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '/' .. fence, 'PX', ARGV[2])
return {1, fence}
""",
)
_RENEW = Script(
    "lease_renew",
    """
-- KEYS: lease;  ARGV: value, ttl ms.  Returns 1 renewed, 0 not held by this value.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
""",
)
_RELEASE = Script(
    "lease_release",
    """
-- KEYS: lease;  ARGV: value.  Returns 1 released, 0 not held by this value.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
""",
)


@dataclass(eq=False)
class Lease:
    """A held lease: its fencing token, and whether it is still known to be held."""

    tenant: str
    session_id: str
    fence: int
    """Grows with every grant of this session's lease: a later holder has a larger one."""
    ttl: float
    value: str = field(repr=False)
    lost: bool = False
    """True once a renewal found the lease gone, or could not reach Redis before expiry."""

    async def check(self) -> None:
        """Raise `LeaseLostError` if the lease is known to be lost (no round trip)."""
        if self.lost:
            raise LeaseLostError(self.session_id, self.fence)


class RedisLeases:
    """Per-session leases with fencing tokens, in the Redis server of ``store``.

    ``ttl`` is the default lifetime of a lease, in seconds: how long a dead holder keeps
    a session locked.
    """

    def __init__(self, store: RedisStore, *, ttl: float = 30.0) -> None:
        self._store = store
        self.ttl = ttl

    @contextlib.asynccontextmanager
    async def hold(
        self,
        tenant: str,
        session_id: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
    ) -> AsyncIterator[Lease]:
        """Take the session's lease (waiting up to ``wait`` seconds, None: no limit), keep
        it renewed while the block runs, and release it after.

        Raises `LeaseBusyError` (a `SessionLockTimeoutError`) when ``wait`` runs out first.
        """
        lease = await self.acquire(tenant, session_id, ttl=ttl, wait=wait)
        renewer = asyncio.create_task(self._keep(lease))
        try:
            yield lease
        finally:
            await cancel_and_wait(renewer)
            with contextlib.suppress(StoreError):  # unreachable: it expires by itself
                await self.release(lease)

    async def acquire(
        self, tenant: str, session_id: str, *, ttl: float | None = None, wait: float | None = None
    ) -> Lease:
        """Take the lease without renewing it (see `hold`); `release` it when done."""
        check_tenant_and_id(tenant, session_id)
        ttl = self.ttl if ttl is None else ttl
        if not 0.01 <= ttl <= 86_400:
            raise InvalidInputError(f"lease ttl must be 0.01 to 86400 seconds, got {ttl}")
        check_wait(wait)
        holder = os.urandom(12).hex()
        keys = [self._keys.lease(tenant, session_id), self._keys.fence(tenant, session_id)]
        start = time.monotonic()
        pause = 0.005
        while True:
            taken, number = await self._run(_ACQUIRE, keys, [holder, int(ttl * 1000)])
            if taken:
                return Lease(tenant, session_id, int(number), ttl, f"{holder}/{number}")
            waited = time.monotonic() - start
            if wait is not None and waited >= wait:
                raise LeaseBusyError(session_id, waited, int(number))
            # Poll: soon at first, then less often; never past the holder's expiry or
            # the caller's deadline.
            sleep = min(pause, max(int(number), 1) / 1000)
            if wait is not None:
                sleep = min(sleep, wait - waited)
            await asyncio.sleep(max(sleep, 0.001))
            pause = min(pause * 2, 0.25)

    async def renew(self, lease: Lease) -> bool:
        """Extend the lease by its ttl; False (and ``lease.lost``) if it is not held."""
        key = self._keys.lease(lease.tenant, lease.session_id)
        renewed = await self._run(_RENEW, [key], [lease.value, int(lease.ttl * 1000)])
        if not renewed:
            lease.lost = True
        return bool(renewed)

    async def release(self, lease: Lease) -> bool:
        """Give the lease up; False if it had already expired or passed to another."""
        key = self._keys.lease(lease.tenant, lease.session_id)
        released = bool(await self._run(_RELEASE, [key], [lease.value]))
        lease.lost = True
        return released

    async def holder_fence(self, tenant: str, session_id: str) -> int | None:
        """The fencing token of the session's current holder, or None when free."""
        check_tenant_and_id(tenant, session_id)
        value = await _call(
            self._store, self._store.client.get(self._keys.lease(tenant, session_id))
        )
        return None if value is None else int(to_text(value).rpartition("/")[2])

    async def _keep(self, lease: Lease) -> None:
        """Renew every ttl/3; mark the lease lost when it is gone or surely expired."""
        deadline = time.monotonic() + lease.ttl
        while not lease.lost:
            await asyncio.sleep(lease.ttl / 3)
            try:
                if not await self.renew(lease):
                    return
                deadline = time.monotonic() + lease.ttl
            except StoreError:
                if time.monotonic() >= deadline:  # it has expired in Redis by now
                    lease.lost = True

    @property
    def _keys(self) -> Keys:
        return self._store.keys

    async def _run(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        return await run_script(self._store.client, script, keys, args, self._store.where)


class RedisEventFeed:
    """Events appended by any process, delivered as they arrive (XREAD on streams).

    ``block`` is how long one XREAD waits for news (kept below the client's socket
    timeout); ``batch`` the most events one read returns; ``retry_every`` the pause
    between attempts to reach Redis again after losing it.
    """

    def __init__(
        self, store: RedisStore, *, block: float = 1.0, batch: int = 256, retry_every: float = 0.5
    ) -> None:
        if block <= 0 or batch < 1 or retry_every <= 0:
            raise InvalidInputError("block and retry_every must be > 0 seconds, batch >= 1")
        self._store = store
        self.block_ms = int(block * 1000)
        self.batch = batch
        self.retry_every = retry_every

    async def follow(self, tenant: str, log_id: str, *, after_seq: int = 0) -> AsyncIterator[Event]:
        """Every event of the log with ``seq > after_seq``, in order, then new ones as
        they are appended (forever: stop iterating to stop).

        Raises `StoreCorruptError` if a seq is missing (the log was deleted and written
        again behind the follower's back: start again from 0).
        """
        check_record_ids(tenant, log_id)
        key = self._store.keys.events(tenant, log_id)
        last = max(after_seq, 0)
        while True:
            for _, entries in await self._read(key, f"{last}-0"):
                for stream_id, fields in entries:
                    event = decode_event(log_id, stream_id, fields)
                    if event.seq != last + 1:
                        raise StoreCorruptError(
                            f"event log {log_id!r} jumped from seq {last} to {event.seq}: "
                            "it was deleted and written again; follow it again from 0"
                        )
                    last = event.seq
                    yield event

    async def notices(self, tenant: str, *, after: str = "$") -> AsyncIterator[EventNotice]:
        """Notices of batches appended to any log of the tenant (see `EventFeed.notices`):
        a resync first, then each batch after position ``after`` (``"$"``: from now on;
        ``"0"``: every notice still kept; a notice's ``position``: the ones after it).

        After a lost connection the feed reads on from the last position it delivered,
        behind a resync (notices trimmed from the capped stream meanwhile are lost).
        """
        validate_id(tenant, "tenant")
        key = self._store.keys.event_notices(tenant)
        newest = await _call(self._store, self._store.client.xrevrange(key, "+", "-", count=1))
        if after == "$":  # pin "now" to an id, so nothing between two reads is missed
            after = to_text(newest[0][0]) if newest else "0-0"
        yield EventNotice(tenant, position=after)
        while True:
            try:
                reply = await self._read(key, after)
            except StoreUnavailableError as exc:
                logger.warning("event feed of %s lost Redis (%s); reconnecting", tenant, exc)
                await self._reconnect()
                yield EventNotice(tenant, position=after)
                continue
            for _, entries in reply:
                for stream_id, fields in entries:
                    after = to_text(stream_id)
                    yield _notice(tenant, after, fields)

    async def _reconnect(self) -> None:
        while True:
            await asyncio.sleep(self.retry_every)
            with contextlib.suppress(StoreUnavailableError):
                await _call(self._store, self._store.client.ping())
                return

    async def _read(self, key: str, after: str) -> Any:
        client = self._store.client
        reply = await _call(
            self._store, client.xread({key: after}, count=self.batch, block=self.block_ms)
        )
        return reply or []


def _notice(tenant: str, position: str, fields: Mapping[Any, Any]) -> EventNotice:
    get = {to_text(k): to_text(v) for k, v in fields.items()}
    return EventNotice(tenant, get["log"], int(get["last"]), int(get["first"]), position)


async def _call(store: RedisStore, pending: Awaitable[Any]) -> Any:
    """Await a redis-py call, translating its errors (see `redis_base.translate`)."""
    try:
        return await pending
    except CLIENT_ERRORS as exc:
        raise translate(exc, store.where) from exc
