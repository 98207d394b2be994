"""The SQL floor of an append: what SQLite alone costs for the rows statekeeper writes.

`bench sessions` compares `Session.append` with the plainest raw code (one INSERT into a
rowid table). This diagnostic splits our side in two, to show how much of the gap is our
Python and how much is the write itself:

- **raw**: the baseline of `bench sessions` (4 KB pages, SQLite's default);
- **SQL only**: plain ``sqlite3`` running, on a real statekeeper file, exactly the
  statements an append commits (the head's live columns, the entry row; its indexes are
  the store's own), with the entry's JSON text precomputed: no statekeeper code runs;
- **entry only**: the same, without the head's update (its row and the activity index):
  what the write would cost if the head were not moved on every append (how far the
  floor would drop with it);
- **ours**: `Session.append` through the public API.

An append changes four b-tree pages (the head row, the activity index, the entry and the
entry-id index) where the raw insert changes one, and each changed page goes to the WAL
whole: with the default 8 KB pages, 32 KB per commit. The sides take turns in batches.
Target (issue 21): with ``process`` and the default page size, our Python (ours minus
SQL only) is at most 30 us per append.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Verdicts
from bench.sessions import Raw, as_message, message_dict
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store
from statekeeper.stores.sqlite.rows import SAVE_LIVE
from statekeeper.stores.sqlite.schema import SEQ_BITS

HISTORY = 1_000
APPENDS = 600
BATCH = 30
_INSERT = (
    "INSERT INTO entries (rid, session_sk, id, parent_seq, kind, created_us, payload, tokens)"
    " VALUES (?, ?, ?, ?, 'message', ?, ?, ?)"
)


class SqlOnly:
    """Our append's statements, driven by plain sqlite3 on a statekeeper file."""

    def __init__(self, path: Path, synchronous: str, session_id: str, *, head: bool = True) -> None:
        self.head = head
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.sk, self.version, self.seq = self.db.execute(
            "SELECT sk, version, last_seq FROM sessions WHERE id=?", (session_id,)
        ).fetchone()
        self.count = self.seq

    def append(self, data: dict[str, str]) -> None:
        self.seq += 1
        now = time.time_ns() // 1000
        text = json.dumps(data, separators=(",", ":"))
        self.db.execute("BEGIN IMMEDIATE")
        if self.head:
            live = (self.seq, self.seq, self.seq, self.seq * 100, self.seq * 100)
            self.db.execute(SAVE_LIVE, (now, self.version + 1, *live, self.sk, self.version))
        self.db.execute(
            _INSERT,
            (
                self.sk << SEQ_BITS | self.seq,
                self.sk,
                f"msg_{now:016x}{self.seq:08x}",
                self.seq - 1,
                now,
                text,
                100,
            ),
        )
        self.db.execute("COMMIT")
        self.version += 1


async def measure(durability: str, page_size: int, folder: Path) -> dict[str, Any]:
    """Microseconds per append on the three sides, in turns."""
    synchronous = "FULL" if durability == "power" else "NORMAL"
    ours_path = folder / f"ours-{durability}-{page_size}.db"
    floor_path = folder / f"floor-{durability}-{page_size}.db"
    bare_path = folder / f"bare-{durability}-{page_size}.db"
    raw = Raw(folder / f"raw-{durability}-{page_size}.db", synchronous)
    filler = [message_dict(n) for n in range(HISTORY)]
    raw.fill(filler)
    ids = {}
    for path in (floor_path, bare_path):  # the floors' files, made by the store
        url = f"sqlite:///{path}?page_size={page_size}"
        async with open_store(url, durability=durability) as store:
            session = await SessionManager(store, "bench", max_messages=None).create()
            await session.append(*(as_message(d) for d in filler))
            ids[path] = session.id
    floor = SqlOnly(floor_path, synchronous, ids[floor_path])
    bare = SqlOnly(bare_path, synchronous, ids[bare_path], head=False)
    url = f"sqlite:///{ours_path}?page_size={page_size}"
    sides: dict[str, list[float]] = {"raw": [], "sql": [], "bare": [], "ours": []}
    async with open_store(url, durability=durability) as store:
        session = await SessionManager(store, "bench", max_messages=None).create()
        await session.append(*(as_message(d) for d in filler))
        for start in range(HISTORY, HISTORY + APPENDS, BATCH):
            batch = [message_dict(n) for n in range(start, start + BATCH)]
            started = time.perf_counter()
            for data in batch:
                await session.append(as_message(data))
            sides["ours"].append((time.perf_counter() - started) / BATCH * 1e6)
            started = time.perf_counter()
            for data in batch:
                floor.append(data)
            sides["sql"].append((time.perf_counter() - started) / BATCH * 1e6)
            started = time.perf_counter()
            for data in batch:
                bare.append(data)
            sides["bare"].append((time.perf_counter() - started) / BATCH * 1e6)
            started = time.perf_counter()
            for data in batch:
                raw.append(data)
            sides["raw"].append((time.perf_counter() - started) / BATCH * 1e6)
    floor.db.close()
    bare.db.close()
    raw.db.close()
    return {side: statistics.median(values) for side, values in sides.items()}


async def run() -> list[tuple[str, int, dict[str, Any]]]:
    """Both durabilities, the default page size and 4 KB pages."""
    results = []
    with tempfile.TemporaryDirectory(prefix="statekeeper-floor-") as folder:
        for durability in ("power", "process"):
            for page_size in (8192, 4096):
                results.append(
                    (durability, page_size, await measure(durability, page_size, Path(folder)))
                )
    return results


PYTHON_TARGET_US = 30.0


def report(results: list[tuple[str, int, dict[str, Any]]]) -> list[str]:
    """Print the split and the verdict on our Python; return the missed target."""
    print(
        f"{'durability':<10} {'page':>6} {'raw us':>7} {'SQL only us':>12} {'entry only':>11} "
        f"{'ours us':>8} {'SQL/raw':>8} {'entry/raw':>10} {'ours/raw':>9} {'our Python us':>14}"
    )
    for durability, page_size, r in results:
        print(
            f"{durability:<10} {page_size:>6} {r['raw']:>7.0f} {r['sql']:>12.0f} "
            f"{r['bare']:>11.0f} {r['ours']:>8.0f} {r['sql'] / r['raw']:>8.2f} "
            f"{r['bare'] / r['raw']:>10.2f} {r['ours'] / r['raw']:>9.2f} "
            f"{r['ours'] - r['sql']:>14.0f}"
        )
    print(
        "(medians of batches; 'entry only' = our SQL without the head's update; "
        "'our Python' = ours - SQL only, the time statekeeper adds)"
    )
    verdicts = Verdicts()
    for durability, page_size, r in results:
        if durability == "process" and page_size == 8192:
            python_us = r["ours"] - r["sql"]
            verdicts.at_most("process: our Python per append, us", python_us, PYTHON_TARGET_US)
    return [f"floor {name}" for name in verdicts.missed]


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
