"""Append and load costs of the files:// store against raw file appends, in one process.

For each durability setting and history length (10, 1,000, 10,000 messages):
- append: the cost of appending one message through ``Session.append`` (one entry line
  plus a rewrite of the small head file), best of ``ROUNDS`` rounds of ``APPENDS``
  appends (the rounds go round the three history lengths, so machine noise hits them
  alike), against two baselines with the same fsync policy (``power``: sync after every
  write; ``process``: none):
  - raw: appending the same JSON line to a plain file opened once;
  - raw+head: the same, plus an atomic rewrite of a 1 KB JSON file (temp file, rename,
    and with ``power`` a sync of the file and of the folder): the least any layout with a
    separate head file pays;
- load: reading the whole session as `Message` objects (``Session.messages()``) in a
  fresh store (so nothing is cached), against reading the plain file and ``json.loads``
  of each line;
- bytes: the transcript and head files against the JSON payload bytes.

The target is O(1) appends: appending at 10,000 messages costs at most 1.5x appending at
10. The ratios to the baselines are reported for information.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from statekeeper.core.messages import Message
from statekeeper.sessions import Session, SessionManager
from statekeeper.stores import Store, open_store

HISTORIES = (10, 1_000, 10_000)
APPENDS = 100
ROUNDS = 3
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


class Raw:
    """A plain JSONL file, opened once, appended to line by line: the baseline."""

    def __init__(self, path: Path, sync: bool) -> None:
        self.path = path
        self.sync = sync
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.head = path.with_suffix(".json")
        self.writes = 0

    def fill(self, lines: list[str]) -> None:
        os.write(self.fd, "".join(lines).encode())
        os.fsync(self.fd)

    def append_one(self, line: str) -> None:
        os.write(self.fd, line.encode())
        if self.sync:
            os.fdatasync(self.fd)

    def append_with_head(self, line: str) -> None:
        self.append_one(line)
        self.writes += 1
        temp = self.head.with_name(f".{self.head.name}.{self.writes}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"{%d}" % self.writes + b" " * 1000)
        if self.sync:
            os.fdatasync(fd)
        os.close(fd)
        os.replace(temp, self.head)
        if self.sync:
            folder = os.open(self.head.parent, os.O_RDONLY)
            os.fsync(folder)
            os.close(folder)

    def load(self) -> list[Any]:
        with open(self.path, "rb") as handle:
            return [json.loads(line) for line in handle]

    def close(self) -> None:
        os.close(self.fd)


def _best(current: float, start: float) -> float:
    return min(current, (time.perf_counter() - start) / APPENDS)


async def measure(durability: str, folder: Path) -> dict[int, dict[str, float]]:
    """The rows of one durability setting, one per history length."""
    roots = {h: folder / f"ours-{durability}-{h}" for h in HISTORIES}
    raws = {
        h: Raw(folder / f"raw-{durability}-{h}.jsonl", durability == "power") for h in HISTORIES
    }
    stores: dict[int, Store] = {}
    sessions: dict[int, Session] = {}
    best = {
        h: {"ours": float("inf"), "raw": float("inf"), "floor": float("inf")} for h in HISTORIES
    }
    try:
        for history in HISTORIES:
            stores[history] = await open_store(f"files://{roots[history]}", durability=durability)
            manager = SessionManager(stores[history], "bench", max_messages=None)
            sessions[history] = session = await manager.create(title="bench")
            filler = [message(n) for n in range(history)]
            for offset in range(0, history, 500):
                await session.append(*filler[offset : offset + 500])
            raws[history].fill([json.dumps(m.to_dict()) + "\n" for m in filler])
        for round_number in range(ROUNDS):
            for history in HISTORIES:
                first = history + round_number * APPENDS
                fresh = [message(first + i) for i in range(APPENDS)]
                lines = [json.dumps(m.to_dict()) + "\n" for m in fresh]
                row, raw, session = best[history], raws[history], sessions[history]
                start = time.perf_counter()
                for m in fresh:
                    await session.append(m)
                row["ours"] = _best(row["ours"], start)
                start = time.perf_counter()
                for line in lines:
                    raw.append_one(line)
                row["raw"] = _best(row["raw"], start)
                start = time.perf_counter()
                for line in lines:
                    raw.append_with_head(line)
                row["floor"] = _best(row["floor"], start)
        ids = {h: sessions[h].id for h in HISTORIES}
    finally:
        for store in stores.values():
            await store.close()

    results: dict[int, dict[str, float]] = {}
    for history in HISTORIES:
        ours_load = raw_load = float("inf")
        for _ in range(3):
            store = await open_store(f"files://{roots[history]}", durability=durability)
            try:
                manager = SessionManager(store, "bench", max_messages=None)
                reopened = await manager.get(ids[history])
                start = time.perf_counter()
                await reopened.messages()
                ours_load = min(ours_load, time.perf_counter() - start)
            finally:
                await store.close()
            start = time.perf_counter()
            raws[history].load()
            raw_load = min(raw_load, time.perf_counter() - start)
        raws[history].close()
        transcript = roots[history] / "bench" / "sessions"
        ours_bytes = sum(p.stat().st_size for p in transcript.iterdir() if p.suffix != ".bak")
        results[history] = {
            "append_us": best[history]["ours"] * 1e6,
            "raw_append_us": best[history]["raw"] * 1e6,
            "floor_append_us": best[history]["floor"] * 1e6,
            "load_ms": ours_load * 1e3,
            "raw_load_ms": raw_load * 1e3,
            # the raw file got the same messages, plus the baseline appends: compare the
            # transcript with the JSON of the messages it holds
            "bytes_ratio": ours_bytes / _json_bytes(history + ROUNDS * APPENDS),
        }
    return results


def _json_bytes(count: int) -> int:
    return sum(len((json.dumps(message(n).to_dict()) + "\n").encode()) for n in range(count))


async def run() -> list[tuple[str, int, dict[str, float]]]:
    """Every measurement, in one process."""
    results = []
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-files-") as folder:
        for durability in ("power", "process"):
            rows = await measure(durability, Path(folder))
            results += [(durability, history, rows[history]) for history in HISTORIES]
    return results


def report(results: list[tuple[str, int, dict[str, float]]]) -> list[str]:
    """Print the table and the verdicts; return the failed targets."""
    print(
        f"{'durability':<10} {'history':>7} {'append us':>10} {'raw us':>8} {'ratio':>6} "
        f"{'raw+head':>9} {'ratio':>6} {'load ms':>8} {'raw ms':>7} {'ratio':>6} "
        f"{'bytes/json':>10}"
    )
    for durability, history, r in results:
        print(
            f"{durability:<10} {history:>7} {r['append_us']:>10.1f} {r['raw_append_us']:>8.1f} "
            f"{r['append_us'] / r['raw_append_us']:>6.2f} {r['floor_append_us']:>9.1f} "
            f"{r['append_us'] / r['floor_append_us']:>6.2f} {r['load_ms']:>8.2f} "
            f"{r['raw_load_ms']:>7.2f} {r['load_ms'] / r['raw_load_ms']:>6.2f} "
            f"{r['bytes_ratio']:>10.2f}"
        )
    by = {(d, h): r for d, h, r in results}
    failed = []
    print()
    for durability in ("power", "process"):
        small, large = by[durability, HISTORIES[0]], by[durability, HISTORIES[-1]]
        name = f"files {durability}: append at 10k / append at 10"
        value = large["append_us"] / small["append_us"]
        verdict = "ok" if value <= 1.5 else "MISSED"
        print(f"{name:<50} {value:6.2f}  (target <= 1.5)  {verdict}")
        if value > 1.5:
            failed.append(name)
        for label, column in (("raw", "raw_append_us"), ("raw+head", "floor_append_us")):
            ratio = large["append_us"] / large[column]
            name = f"files {durability}: append / {label} at 10k"
            print(f"{name:<50} {ratio:6.2f}  (for information)")
    return failed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
