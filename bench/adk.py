"""ADK session service on statekeeper's SQLite store vs ADK's own SQLite services.

Sides, each on a SQLite file of its own, all through ADK's ``BaseSessionService`` API:
- ours: `StatekeeperSessionService` on ``sqlite:///`` at its defaults (durability
  ``power``: WAL, ``synchronous=FULL``, an fsync on every commit);
- database: ADK's ``DatabaseSessionService`` (SQLAlchemy on aiosqlite), with
  ``PRAGMA synchronous=FULL`` set by a connect listener on its engine;
- sqlite: ADK's ``SqliteSessionService`` (aiosqlite, a connection per call), whose
  connections are at SQLite's default ``synchronous=FULL`` (checked below; issuing the
  PRAGMA itself on every call would add a statement to its path).
Durability is checked on each side's own connection before timing; the peers keep
their rollback journal (their default).

For a session of 10 and of 10,000 events (a ~450-byte model reply; every fourth event
also changes session state, every tenth user state):
- get: ``get_session`` of the whole session (events built, state merged);
- recent: ``get_session`` with ``GetSessionConfig(num_recent_events=N)``;
- after: ``get_session`` with ``GetSessionConfig(after_timestamp=T)``, T the
  timestamp of the N-th last event (so N events come back);
- append: ``append_event`` of one more such event, through the session object the
  previous append returned (as ADK's ``Runner`` does).
N is 20 (5 for the 10-event session, and where ours at 10,000 events is compared
with ours at 10). Ours and each peer take turns in batches
(`bench.common.interleave`); each batch gives one ratio ours / theirs (below 1: ours
is faster). Reads are timed first, while every session holds exactly its history.

Targets: every operation of ours at least 1.5x as fast as each peer's (ratio <= 0.67)
at both lengths; and neither appends nor the configured reads grow with the history
(ours at 10,000 events / ours at 10, interleaved, <= 1.5).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import aiosqlite
from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService, DatabaseSessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy import text

from bench.common import Ratios, Verdicts, interleave, spread
from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.stores import open_store

HISTORIES = (10, 10_000)
APP, USER, SID = "bench", "user-1", "session-1"
FASTER = 1 / 1.5
"""The target ratio ours / theirs: ours at least 1.5x as fast."""
TEXT = (
    "Your order {n} left the depot on Tuesday; the carrier expects to deliver it on "
    "Thursday. If it does not arrive by Friday I can send a replacement, or refund it "
    "to the card you paid with. The confirmation e-mail goes to the address on the "
    "order. Is there anything else I can help you with today? "
)
FULL = 2
"""``PRAGMA synchronous`` of FULL."""


def event(n: int) -> Event:
    """The n-th event of the mix."""
    delta: dict[str, Any] = {}
    if n % 4 == 3:
        delta["turn"] = n
    if n % 10 == 9:
        delta["user:seen"] = n
    return Event(
        invocation_id=f"inv-{n // 4}",
        author="support",
        content=types.Content(role="model", parts=[types.Part(text=TEXT.format(n=n))]),
        actions=EventActions(state_delta=delta),
    )


class Side:
    """One service with one session, appended to through the object it returned."""

    def __init__(self, service: BaseSessionService, session_id: str = SID) -> None:
        self.service = service
        self.session_id = session_id
        self.session: Session | None = None
        self.stamps: list[float] = []
        self.recent = 0

    async def fill(self, events: int) -> None:
        self.session = await self.service.create_session(
            app_name=APP, user_id=USER, session_id=self.session_id
        )
        for _ in range(events):
            await self.append(0)
        self.recent = 20 if events > 100 else 5

    async def append(self, _: int) -> None:
        assert self.session is not None
        appended = await self.service.append_event(self.session, event(len(self.stamps)))
        self.stamps.append(appended.timestamp)

    async def _get(self, config: GetSessionConfig | None, expected: int) -> None:
        got = await self.service.get_session(
            app_name=APP, user_id=USER, session_id=self.session_id, config=config
        )
        assert got is not None
        assert len(got.events) == expected, (len(got.events), expected)

    async def get(self, _: int) -> None:
        await self._get(None, len(self.stamps))

    async def recent_events(self, _: int, n: int = 0) -> None:
        n = n or self.recent
        await self._get(GetSessionConfig(num_recent_events=n), n)

    async def after(self, _: int, n: int = 0) -> None:
        n = n or self.recent
        await self._get(GetSessionConfig(after_timestamp=self.stamps[-n]), n)

    async def recent_5(self, _: int) -> None:
        await self.recent_events(_, 5)

    async def after_5(self, _: int) -> None:
        await self.after(_, 5)


def _full_sync(dbapi_connection: Any, _: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


async def _check_durability(database: DatabaseSessionService, sqlite_path: Path) -> None:
    """Each peer's own connections sync every commit as ours do (``FULL``)."""
    async with database.db_engine.connect() as conn:
        level = (await conn.execute(text("PRAGMA synchronous"))).scalar()
    assert level == FULL, f"DatabaseSessionService: synchronous={level}"
    async with aiosqlite.connect(str(sqlite_path)) as db:  # as SqliteSessionService connects
        level = (await (await db.execute("PRAGMA synchronous")).fetchone() or [None])[0]
    assert level == FULL, f"SqliteSessionService: synchronous={level}"
    # And the default does not differ for a plain sqlite3 connection either.
    assert sqlite3.connect(":memory:").execute("PRAGMA synchronous").fetchone()[0] == FULL


async def _measure(history: int, folder: Path) -> dict[str, Ratios]:
    started = time.perf_counter()
    store = await open_store(f"sqlite:///{folder / f'ours-{history}.db'}")
    database = DatabaseSessionService(f"sqlite+aiosqlite:///{folder / f'db-{history}.db'}")
    sqlalchemy_event.listen(database.db_engine.sync_engine, "connect", _full_sync)
    sqlite_path = folder / f"sqlite-{history}.db"
    sqlite = SqliteSessionService(str(sqlite_path))
    service = StatekeeperSessionService(store)
    sides = {
        "ours": Side(service),
        "database": Side(database),
        "sqlite": Side(sqlite),
        "ours at 10": Side(service, "short-session"),  # beside the long one, same store
    }
    try:
        for name, side in sides.items():
            await side.fill(10 if name == "ours at 10" else history)
        await _check_durability(database, sqlite_path)
        took = time.perf_counter() - started
        print(f"  (filled three sessions of {history} events in {took:.0f} s)")
        out: dict[str, Ratios] = {}
        ours, short = sides["ours"], sides["ours at 10"]
        whole = (7, 1) if history > 100 else (7, 20)  # (batches, batch size)
        # Reads first, while every session holds exactly ``history`` events.
        for name in ("database", "sqlite"):
            theirs = sides[name]
            out[f"get {name}"] = await interleave(ours.get, theirs.get, *whole)
            out[f"recent {name}"] = await interleave(
                ours.recent_events, theirs.recent_events, 7, 10
            )
            out[f"after {name}"] = await interleave(ours.after, theirs.after, 7, 10)
        # The same 5 events from the long session and from the 10-event one.
        out["recent ours at 10"] = await interleave(ours.recent_5, short.recent_5, 9, 40)
        out["after ours at 10"] = await interleave(ours.after_5, short.after_5, 9, 40)
        for name in ("database", "sqlite"):
            out[f"append {name}"] = await interleave(ours.append, sides[name].append, 6, 5)
        out["append ours at 10"] = await interleave(ours.append, short.append, 8, 10)
        return out
    finally:
        await store.close()
        await database.close()
        await sqlite.close()


async def run() -> dict[int, dict[str, Ratios]]:
    """Measure both history lengths; results by history, then by "op baseline"."""
    # ADK logs a line per DatabaseSessionService start-up; keep the report readable.
    logging.getLogger("google_adk").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as folder:
        return {h: await _measure(h, Path(folder)) for h in HISTORIES}


def report(results: dict[int, dict[str, Ratios]]) -> list[str]:
    """Print the table and the verdicts; return the missed targets."""
    print(f"{'history':>7} {'op vs baseline':<18} {'ours us':>10} {'theirs us':>10}  ours/theirs")
    for history, by_op in results.items():
        for name, ratios in by_op.items():
            print(
                f"{history:>7} {name:<18} {ratios.ours_us:>10.0f} {ratios.raw_us:>10.0f}  "
                f"{spread(ratios)}"
            )
    verdicts = Verdicts()
    peers = {"database": "DatabaseSessionService", "sqlite": "SqliteSessionService"}
    for history, by_op in results.items():
        for op in ("get", "recent", "after", "append"):
            for peer, name in peers.items():
                size = "10k" if history == 10_000 else str(history)
                label = f"adk {op} {size}: ours / {name}"
                verdicts.at_most(label, list(by_op[f"{op} {peer}"]), round(FASTER, 2))
    large = results[HISTORIES[-1]]
    for op in ("append", "recent", "after"):
        verdicts.at_most(f"adk {op}: ours at 10k / at 10", list(large[f"{op} ours at 10"]), 1.5)
    return verdicts.missed


if __name__ == "__main__":
    report(asyncio.run(run()))
