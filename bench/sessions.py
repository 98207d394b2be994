"""Append and load costs of SQLite sessions against raw sqlite3, in one process.

For each durability setting and history length (10, 1,000, 10,000 messages):
- append: the mean cost of appending one message through ``Session.append`` (one
  transaction each), against raw sqlite3 encoding the same kind of message to JSON and
  inserting it into the same table in WAL mode, one row per transaction, with the same
  ``synchronous`` setting;
- load: reading the whole session as `Message` objects (``Session.messages()``),
  against a raw ``SELECT`` of the payloads plus ``json.loads`` of each;
- bytes: the database file (after a WAL checkpoint) against the JSON payload bytes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from statekeeper.core.messages import Message
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store
from statekeeper.stores.sqlite.schema import MIGRATIONS

HISTORIES = (10, 1_000, 10_000)
APPENDS = 300
BATCH = 20
TEXT = (
    "The customer asked about order {n}: it left the depot on Tuesday, the carrier "
    "expects delivery on Thursday, and a replacement can be sent once the carrier "
    "confirms the parcel is lost. They also asked whether the confirmation e-mail goes "
    "to the address on the order, which it does. "
)


def message(n: int) -> Message:
    """A realistic chat message of about 500 bytes of JSON."""
    role = "user" if n % 2 == 0 else "assistant"
    return Message(role=role, content=TEXT.format(n=n))


def best(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` runs of ``fn``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


class Raw:
    """Raw sqlite3 with the entries table of our schema: the baseline."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        for statement in MIGRATIONS[0].split(";"):
            if "entries" in statement and statement.strip():
                self.db.execute(statement)
        self.seq = 0

    def fill(self, payloads: list[str]) -> None:
        self.db.execute("BEGIN")
        for text in payloads:
            self.insert(text)
        self.db.execute("COMMIT")

    def insert(self, text: str) -> None:
        self.seq += 1
        self.db.execute(
            "INSERT INTO entries (session_sk, seq, id, parent_seq, kind, created_us, payload)"
            " VALUES (1, ?, ?, ?, 'message', ?, ?)",
            (self.seq, f"msg_{self.seq:028x}", self.seq - 1 or None, time.time_ns() // 1000, text),
        )

    def append_one(self, text: str) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.insert(text)
        self.db.execute("COMMIT")

    def load(self) -> list[Any]:
        rows = self.db.execute("SELECT payload FROM entries WHERE session_sk=1 ORDER BY seq")
        return [json.loads(text) for (text,) in rows]


async def measure(durability: str, history: int, folder: Path) -> dict[str, float]:
    """One row of results."""
    synchronous = "FULL" if durability == "power" else "NORMAL"
    path = folder / f"ours-{durability}-{history}.db"
    store = await open_store(f"sqlite:///{path}", durability=durability)
    raw = Raw(folder / f"raw-{durability}-{history}.db", synchronous)
    try:
        manager = SessionManager(store, "bench", max_messages=None)
        session = await manager.create(title="bench")
        filler = [message(n) for n in range(history)]
        for start in range(0, history, 500):
            await session.append(*filler[start : start + 500])
        raw.fill([json.dumps(m.to_dict()) for m in filler])
        # Both sides start the measurement with the history checkpointed into the file,
        # so neither pays for the fill's checkpoint inside the measured appends.
        await store.checkpoint(truncate=True)  # type: ignore[attr-defined]
        raw.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

        # Ours and raw take turns in small batches, so disk-latency drift (fsync times on
        # a shared machine vary several-fold) hits both sides alike.
        fresh = [message(history + n) for n in range(APPENDS)]
        raw_messages = [message(history + APPENDS + n) for n in range(APPENDS)]
        ours_time = raw_time = 0.0
        for start_at in range(0, APPENDS, BATCH):
            start = time.perf_counter()
            for m in fresh[start_at : start_at + BATCH]:
                await session.append(m)
            ours_time += time.perf_counter() - start
            start = time.perf_counter()
            for m in raw_messages[start_at : start_at + BATCH]:  # raw encodes the message too
                raw.append_one(json.dumps(m.to_dict()))
            raw_time += time.perf_counter() - start
        ours_append, raw_append = ours_time / APPENDS, raw_time / APPENDS

        loop = asyncio.get_running_loop()
        ours_load = min([await _timed(loop, session.messages) for _ in range(3)])
        raw_load = best(raw.load)

        payload_bytes = sum(len(json.dumps(m.to_dict()).encode()) for m in filler + fresh)
    finally:
        await store.close()
        raw.db.close()
    checkpoint = sqlite3.connect(path)
    checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    checkpoint.close()
    return {
        "append_us": ours_append * 1e6,
        "raw_append_us": raw_append * 1e6,
        "load_ms": ours_load * 1e3,
        "raw_load_ms": raw_load * 1e3,
        "bytes_ratio": path.stat().st_size / payload_bytes,
    }


async def _timed(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> float:
    start = loop.time()
    await fn()
    return loop.time() - start


async def run() -> list[tuple[str, int, dict[str, float]]]:
    """Every measurement, in one process."""
    results = []
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-") as folder:
        for durability in ("power", "process"):
            for history in HISTORIES:
                row = await measure(durability, history, Path(folder))
                results.append((durability, history, row))
    return results


def report(results: list[tuple[str, int, dict[str, float]]]) -> list[str]:
    """Print the table and the verdicts; return the failed targets."""
    print(
        f"{'durability':<10} {'history':>7} {'append us':>10} {'raw us':>8} {'ratio':>6} "
        f"{'load ms':>8} {'raw ms':>7} {'ratio':>6} {'bytes/json':>10}"
    )
    for durability, history, r in results:
        print(
            f"{durability:<10} {history:>7} {r['append_us']:>10.1f} {r['raw_append_us']:>8.1f} "
            f"{r['append_us'] / r['raw_append_us']:>6.2f} {r['load_ms']:>8.2f} "
            f"{r['raw_load_ms']:>7.2f} {r['load_ms'] / r['raw_load_ms']:>6.2f} "
            f"{r['bytes_ratio']:>10.2f}"
        )
    failed = []
    by = {(d, h): r for d, h, r in results}
    checks: list[tuple[str, float, float]] = []
    for durability, raw_limit in (("power", 1.5), ("process", 3.0)):
        small, large = by[durability, HISTORIES[0]], by[durability, HISTORIES[-1]]
        checks.append(
            (
                f"{durability}: append at 10k / append at 10",
                large["append_us"] / small["append_us"],
                1.5,
            )
        )
        checks.append(
            (
                f"{durability}: append / raw at 10k",
                large["append_us"] / large["raw_append_us"],
                raw_limit,
            )
        )
        checks.append(
            (f"{durability}: load 10k / raw", large["load_ms"] / large["raw_load_ms"], 1.5)
        )
        checks.append((f"{durability}: bytes on disk / JSON", large["bytes_ratio"], 1.3))
    print()
    for name, value, limit in checks:
        verdict = "ok" if value <= limit else "MISSED"
        print(f"{name:<40} {value:6.2f}  (target <= {limit})  {verdict}")
        if value > limit:
            failed.append(name)
    return failed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
