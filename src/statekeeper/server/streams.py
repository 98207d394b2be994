"""Live events for the streams: one reader per run log, shared by every client of it.

A client of a run (`run_events`) registers its inbox with the run's `LogTail`, then
reads the log itself from its own position until it is caught up, then takes what the
tail pushes, skipping what it has and reading the log again on a gap or an overflow.
So it sees every event once, in seq order, however the tail and the client interleave.
The tail reads the log when the store's event feed says the run was written (Redis,
PostgreSQL with ``notify_channel``), when a request of this server changed the run, and
every ``poll_interval`` seconds without a feed (a slow safety read with one).

The tenant stream (`tenant_events`) scans the tenant's live runs (the runs index) on the
same signals, and its cursor is the position it reached in each run it sent events of.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, NotFoundError, StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.runs.lifecycle import FINISHED
from statekeeper.runs.store import RunStore
from statekeeper.runtime.coordination import EventFeed
from statekeeper.stores.base import Event, Store
from statekeeper.tasks import cancel_and_wait

__all__ = ["EventHub", "TenantCursor", "feed_of", "run_events", "tenant_events"]

_log = logging.getLogger(__name__)
_PAGE = 256
_INBOX = 4096  # events a slow client may hold before it re-reads the log instead
_SAFETY_READ = 5.0  # seconds: with a feed, still read now and then
_FEED_WAIT = 10.0  # seconds a new stream waits for its tenant's feed to listen


class _Inbox:
    """What the tail pushed to one client; overflows into "re-read the log"."""

    def __init__(self) -> None:
        self.events: deque[Event] = deque()
        self.overflow = False
        self.ready = asyncio.Event()

    def push(self, events: list[Event]) -> None:
        if len(self.events) + len(events) > _INBOX:
            self.events.clear()
            self.overflow = True
        else:
            self.events.extend(events)
        self.ready.set()


class _Signal:
    """What woke a tenant stream: the runs written (None: any run, rescan them all)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.runs: set[str] | None = set()

    def note(self, run_id: str | None) -> None:
        if run_id is None or self.runs is None:
            self.runs = None
        else:
            self.runs.add(run_id)
        self.event.set()

    def take(self) -> set[str] | None:
        """The runs noted since the last take (None: rescan), and start over."""
        runs, self.runs = self.runs, set()
        self.event.clear()
        return runs


class LogTail:
    """The one reader of a run's event log in this server."""

    def __init__(self, hub: EventHub, tenant: str, run_id: str) -> None:
        self.hub, self.tenant, self.run_id = hub, tenant, run_id
        self.pos: int | None = None  # set by the first client that caught up
        self.inboxes: set[_Inbox] = set()
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        wait = _SAFETY_READ if self.hub.has_feed else self.hub.poll_interval
        while self.inboxes:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.changed.wait()
            self.changed.clear()
            try:
                await self._read()
            except StatekeeperError as exc:  # the clients read the log themselves too
                _log.warning("reading the events of run %s failed: %s", self.run_id, exc)

    async def _read(self) -> None:
        while self.pos is not None and self.inboxes:
            page = await self.hub.store.read_events(
                self.tenant, self.run_id, after_seq=self.pos, limit=_PAGE
            )
            if not page:
                return
            self.pos = page[-1].seq
            for inbox in tuple(self.inboxes):
                inbox.push(page)


@dataclass
class EventHub:
    """The server's live-event machinery: log tails per run, tenant signals, the feed."""

    store: Store
    poll_interval: float = 0.25
    feed: EventFeed | None = None
    tails: dict[tuple[str, str], LogTail] = field(default_factory=dict)
    tenant_waiters: dict[str, set[_Signal]] = field(default_factory=dict)
    feeds: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    listening: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    @property
    def has_feed(self) -> bool:
        return self.feed is not None

    def poke(self, tenant: str, run_id: str | None = None) -> None:
        """Something (a notice, a request here) wrote to ``run_id`` (None: any run)."""
        for (owner, run), tail in self.tails.items():
            if owner == tenant and (run_id is None or run == run_id):
                tail.changed.set()
        for waiter in self.tenant_waiters.get(tenant, ()):
            waiter.note(run_id)

    def _listen(self, tenant: str) -> None:
        if self.feed is not None and tenant not in self.feeds:
            ready = self.listening[tenant] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._follow(self.feed, tenant, ready))
            self.feeds[tenant] = task

    async def ready(self, tenant: str) -> None:
        """Return once the tenant's feed listens (at once without a feed, and after
        `_FEED_WAIT` seconds at most: a feed that cannot connect leaves the safety reads)."""
        self._listen(tenant)
        ready = self.listening.get(tenant)
        if ready is not None and not ready.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FEED_WAIT):
                    await asyncio.shield(ready)

    async def _follow(self, feed: EventFeed, tenant: str, ready: asyncio.Future[None]) -> None:
        while True:
            try:
                async for notice in feed.notices(tenant):
                    if not ready.done():  # the first notice: listening from now on
                        ready.set_result(None)
                    self.poke(tenant, notice.log_id)
            except StatekeeperError as exc:  # polled meanwhile: the tails still read
                _log.warning("the event feed of tenant %r failed (%s); retrying", tenant, exc)
            await asyncio.sleep(1.0)

    @contextlib.contextmanager
    def attach(self, tenant: str, run_id: str, inbox: _Inbox) -> Any:
        self._listen(tenant)
        tail = self.tails.get((tenant, run_id))
        if tail is None:
            tail = self.tails[tenant, run_id] = LogTail(self, tenant, run_id)
        tail.inboxes.add(inbox)
        if tail.task is None or tail.task.done():
            tail.task = asyncio.create_task(tail.run())
        try:
            yield tail
        finally:
            tail.inboxes.discard(inbox)
            if not tail.inboxes:
                tail.changed.set()  # its loop ends
                if self.tails.get((tenant, run_id)) is tail:
                    del self.tails[tenant, run_id]

    @contextlib.contextmanager
    def tenant_signal(self, tenant: str) -> Any:
        self._listen(tenant)
        signal = _Signal()
        self.tenant_waiters.setdefault(tenant, set()).add(signal)
        try:
            yield signal
        finally:
            self.tenant_waiters[tenant].discard(signal)

    async def aclose(self) -> None:
        for task in [*self.feeds.values(), *(t.task for t in self.tails.values() if t.task)]:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        self.feeds.clear()


async def _pages(store: Store, tenant: str, run_id: str, after: int) -> AsyncIterator[list[Event]]:
    while page := await store.read_events(tenant, run_id, after_seq=after, limit=_PAGE):
        yield page
        after = page[-1].seq


async def run_events(hub: EventHub, tenant: str, run_id: str, after: int) -> AsyncIterator[Event]:
    """Every event of the run after seq ``after``, in order, then live, forever."""
    inbox, pos = _Inbox(), after
    with hub.attach(tenant, run_id, inbox) as tail:
        reread = True
        while True:
            if reread or inbox.overflow:
                inbox.overflow = reread = False
                async for page in _pages(hub.store, tenant, run_id, pos):
                    for event in page:
                        yield event
                    pos = page[-1].seq
                if tail.pos is None:
                    tail.pos = pos  # the tail reads on from where this client caught up
                continue
            if not inbox.events:
                inbox.ready.clear()
                await inbox.ready.wait()
                continue
            event = inbox.events.popleft()
            if event.seq == pos + 1:
                pos = event.seq
                yield event
            elif event.seq > pos + 1:
                reread = True  # the tail was ahead of this client: read the gap


# -- the tenant stream ----------------------------------------------------------------------


@dataclass
class TenantCursor:
    """Where a tenant stream is: its start, and the last seq sent of each run it sent.

    A run it sent nothing of is read from its start, keeping events at or after
    ``since``: exactly those the client has not seen.
    """

    since: datetime
    sent: dict[str, int] = field(default_factory=dict)

    def token(self) -> str:
        data = {"s": self.since.isoformat(), "p": self.sent}
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def parse(cls, token: str | None) -> TenantCursor:
        if not token:
            return cls(utcnow())
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            data = json.loads(raw)
            sent = {validate_id(k, "run id"): _seq(v) for k, v in dict(data["p"]).items()}
            since = datetime.fromisoformat(data["s"])
            if since.tzinfo is None:  # the reader compares it with aware times
                raise ValueError("a cursor's time carries its time zone")
            return cls(since, sent)
        except (ValueError, TypeError, KeyError, OverflowError, binascii.Error) as exc:
            raise InvalidInputError(
                f"Last-Event-ID {token[:40]!r} is not a cursor of this stream; reconnect "
                "without it to start from now"
            ) from exc


def _seq(value: object) -> int:
    """An event seq from a cursor: a whole number from 0 to 2**63 - 1 (ValueError else)."""
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError(f"{value!r} is not an event seq")
    return value


async def _live_runs(store: Store, tenant: str, since: datetime) -> dict[str, str | None]:
    """Run id -> session id of the runs that may get events: not finished, or updated
    since the stream began."""
    runs = RunStore(store, tenant)
    found: dict[str, str | None] = {}
    after: str | None = None
    while page := await runs.list(after=after, limit=500):
        for index in page:
            if index.status not in FINISHED or index.updated_at >= since:
                found[index.run_id] = index.session_id
        after = page[-1].run_id
        if len(page) < 500:
            break
    return found


async def tenant_events(
    hub: EventHub, tenant: str, cursor: TenantCursor
) -> AsyncIterator[tuple[Event, str | None]]:
    """The events of the tenant's runs (with each run's session id), from the cursor on.

    A notice names the run written: only that one is read. A resync, or the periodic
    read, rescans every run that may get events (see `_live_runs`).
    """
    seen: dict[str, int] = {}  # read up to here, sent or not
    sessions: dict[str, str | None] = {}
    runs = RunStore(hub.store, tenant)
    with hub.tenant_signal(tenant) as signal:
        noted: set[str] | None = None
        while True:
            if noted is None:
                sessions |= await _live_runs(hub.store, tenant, cursor.since)
            for run_id in sorted(sessions if noted is None else noted):
                if run_id not in sessions:
                    sessions[run_id] = await _session_of(runs, run_id)
                start = seen.get(run_id, cursor.sent.get(run_id, 0))
                async for page in _pages(hub.store, tenant, run_id, start):
                    for event in page:
                        if run_id in cursor.sent or event.ts >= cursor.since:
                            cursor.sent[run_id] = event.seq
                            yield event, sessions[run_id]
                    seen[run_id] = page[-1].seq
            try:
                async with asyncio.timeout(_SAFETY_READ if hub.has_feed else hub.poll_interval):
                    await signal.event.wait()
                noted = signal.take()
            except TimeoutError:  # the periodic read: rescan every live run
                signal.take()
                noted = None


async def _session_of(runs: RunStore, run_id: str) -> str | None:
    try:
        return (await runs.index(run_id))[0].session_id
    except NotFoundError:  # a log without a run (events published on a bare bus)
        return None


def feed_of(store: Store, url: str) -> EventFeed | None:
    """The event feed of the store, when its backend has one (else None: poll)."""
    kind = type(store).__name__
    if kind == "RedisStore":
        from statekeeper.stores.redis import RedisEventFeed

        return RedisEventFeed(store)  # type: ignore[arg-type]
    channel = getattr(store, "notify_channel", None)
    if kind == "PostgresStore" and channel:
        from statekeeper.stores.postgres import PgEventFeed

        schema = getattr(store, "schema", None) or "statekeeper"
        return PgEventFeed.from_url(url.partition("?")[0], channel=channel, schema=schema)
    return None
