"""ADK session service on statekeeper's SQLite store vs ADK's own SQLite services.

Sides, each on a SQLite file of its own, all through ADK's ``BaseSessionService`` API:
- ours: `StatekeeperSessionService` on ``sqlite:///`` (durability ``power``: fsync on
  every commit, WAL);
- database: ADK's ``DatabaseSessionService`` (SQLAlchemy on aiosqlite);
- sqlite: ADK's ``SqliteSessionService`` (aiosqlite, a connection per call).
ADK's services use SQLite's defaults (rollback journal, ``synchronous=FULL``), so every
side syncs each commit to disk.

For a session of 10 and of 10,000 events (a ~450-byte model reply; every fourth event
also changes session state, every tenth user state):
- append: ``append_event`` of one more such event, through the session object the
  previous append returned (as ADK's ``Runner`` does);
- get: ``get_session`` of the whole session (events decoded, state merged).
Ours and each baseline take turns in batches (`bench.common.interleave`); each batch
gives one ratio ours / theirs (below 1: ours is faster). Reads are timed first, while
every session holds exactly the history length.

Targets: appends stay flat (at 10,000 events ours costs at most 1.5x an append to a
10-event session of the same store, the two interleaved), and ours appends no slower
than ADK's database service at 10,000 events. Reads are reported without a target:
building 10,000 ADK events (genai's models) is most of either side's time.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService, DatabaseSessionService, Session
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types

from bench.common import Ratios, Verdicts, interleave, spread
from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.stores import open_store

HISTORIES = (10, 10_000)
APP, USER, SID = "bench", "user-1", "session-1"
TEXT = (
    "Your order {n} left the depot on Tuesday; the carrier expects to deliver it on "
    "Thursday. If it does not arrive by Friday I can send a replacement, or refund it "
    "to the card you paid with. The confirmation e-mail goes to the address on the "
    "order. Is there anything else I can help you with today? "
)


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
        self.count = 0

    async def fill(self, events: int) -> None:
        self.session = await self.service.create_session(
            app_name=APP, user_id=USER, session_id=self.session_id
        )
        for _ in range(events):
            await self.append(0)

    async def append(self, _: int) -> None:
        assert self.session is not None
        await self.service.append_event(self.session, event(self.count))
        self.count += 1

    async def get(self, _: int) -> None:
        got = await self.service.get_session(app_name=APP, user_id=USER, session_id=self.session_id)
        assert got is not None
        assert len(got.events) == self.count


async def _measure(history: int, folder: Path) -> dict[str, Ratios]:
    started = time.perf_counter()
    store = await open_store(f"sqlite:///{folder / f'ours-{history}.db'}")
    database = DatabaseSessionService(f"sqlite+aiosqlite:///{folder / f'db-{history}.db'}")
    sqlite = SqliteSessionService(str(folder / f"sqlite-{history}.db"))
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
        took = time.perf_counter() - started
        print(f"  (filled three sessions of {history} events in {took:.0f} s)")
        appends = 30 if history > 100 else 60
        gets = (1, 3) if history > 100 else (20, 5)
        out: dict[str, Ratios] = {}
        ours = sides["ours"]
        # Reads first, while every session holds exactly ``history`` events; the appends
        # after them add fewer than 1% to the long sessions.
        for name in ("database", "sqlite"):
            out[f"get {name}"] = await interleave(ours.get, sides[name].get, gets[1], gets[0])
        for name in ("database", "sqlite"):
            theirs = sides[name]
            out[f"append {name}"] = await interleave(ours.append, theirs.append, 5, appends // 5)
        out["append ours at 10"] = await interleave(ours.append, sides["ours at 10"].append, 5, 6)
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
    large = results[HISTORIES[-1]]
    verdicts.at_most("adk: ours append at 10k / at 10", list(large["append ours at 10"]), 1.5)
    verdicts.at_most(
        "adk: append at 10k, ours / DatabaseSessionService", list(large["append database"]), 1.0
    )
    verdicts.info("adk: append at 10k, ours / SqliteSessionService", list(large["append sqlite"]))
    verdicts.info("adk: get at 10k, ours / DatabaseSessionService", list(large["get database"]))
    verdicts.info("adk: get at 10k, ours / SqliteSessionService", list(large["get sqlite"]))
    return verdicts.missed


if __name__ == "__main__":
    report(asyncio.run(run()))
