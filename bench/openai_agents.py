"""The OpenAI Agents SDK adapter against the SDK's own ``SQLiteSession``.

Both sides are the SDK ``Session`` a ``Runner`` calls: ``add_items`` (one item per
call, the realistic mix of a user turn, a function call and its ~2 KB output),
``get_items`` (all items, and the newest 20 as ``SessionSettings(limit=20)`` asks) and
``pop_item``, on a session that already holds ``history`` items; and the file's bytes.
Ours is `StatekeeperSession` over ``sqlite:///`` (default durability: fsync on commit);
theirs is ``SQLiteSession`` on a file (WAL at SQLite's default ``synchronous``, FULL
in this build: an fsync per commit too). The sides take turns in batches
(`bench.common.interleave`); each batch gives one ratio ours / theirs. One more row
compares ``add_items`` with the store's own ``append_entries`` of the same entry: what
the adapter adds on top of the store.

    python -m bench openai_agents
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from agents import SQLiteSession

from bench.common import Ratios, Verdicts, interleave
from statekeeper.integrations.openai_agents import StatekeeperSession
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EntryDraft

HISTORIES = (10, 10_000)
TOOL_OUTPUT = '{"order": N, "events": [' + ", ".join(['{"at": "2026-11-25T10:00:00Z"}'] * 60) + "]}"
TARGET = 1 / 1.5
"""Upper limit of ours / SQLiteSession for every operation, at 10 and 10,000 items
(issue 21: each at least 1.5x faster than the SDK's own session)."""
BYTES_TARGET = 1.0
"""Upper limit of our file's bytes over SQLiteSession's, for the same items."""
PLAN = {  # operation -> (batches, operations per batch)
    "add_items": (16, 25),
    "get_items(20)": (16, 25),
    "get_items()": (6, 2),
    "pop_item": (16, 25),
}


def sdk_item(n: int) -> dict[str, Any]:
    """The n-th item: a user turn, a function call, or its ~2 KB output."""
    if n % 3 == 0:
        return {"role": "user", "content": f"Where is order {n}? " * 20}
    if n % 3 == 1:
        args = f'{{"order": {n}}}'
        return {"type": "function_call", "call_id": f"c{n}", "name": "lookup", "arguments": args}
    return {
        "type": "function_call_output",
        "call_id": f"c{n - 1}",
        "output": TOOL_OUTPUT.replace("N", str(n), 1),
    }


async def fill(session: Any, count: int) -> None:
    for start in range(0, count, 500):
        await session.add_items([sdk_item(n) for n in range(start, min(count, start + 500))])


def file_bytes(path: Path) -> int:
    """The bytes of a database once its WAL is checkpointed into it."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        db.close()
    return path.stat().st_size


async def measure(history: int, folder: Path) -> tuple[dict[str, Ratios], float]:
    """Ratios of each operation at one history length (fresh sessions on both sides)."""
    store = await open_store(f"sqlite:///{folder / f'ours-{history}.db'}")
    theirs = SQLiteSession("bench", folder / f"sdk-{history}.db")
    try:
        ours = StatekeeperSession("bench", store)
        await fill(ours, history)
        await fill(theirs, history)
        # SQLiteSession checkpoints its WAL inline while it fills; our store does it in
        # the background: let that finish so the fill's cost is not timed as appends.
        await store.checkpoint()  # type: ignore[attr-defined]
        # Bytes now, while both files hold the same items: our pops keep the popped
        # entries (readable in the log), the SDK deletes its rows.
        ours_bytes = file_bytes(folder / f"ours-{history}.db")
        bytes_ratio = ours_bytes / file_bytes(folder / f"sdk-{history}.db")
        results: dict[str, Ratios] = {}
        for name, (batches, size) in PLAN.items():
            if name == "pop_item":
                # Enough items on both sides that every pop finds one (not timed).
                extra = [sdk_item(history + n) for n in range((batches + 1) * size)]
                await ours.add_items(extra)  # type: ignore[arg-type]
                await theirs.add_items(extra)  # type: ignore[arg-type]

                async def our_op(n: int) -> object:
                    return await ours.pop_item()

                async def their_op(n: int) -> object:
                    return await theirs.pop_item()
            elif name == "add_items":

                async def our_op(n: int) -> object:
                    return await ours.add_items([sdk_item(history + n)])  # type: ignore[list-item]

                async def their_op(n: int) -> object:
                    return await theirs.add_items([sdk_item(history + n)])  # type: ignore[list-item]
            else:
                limit = 20 if name == "get_items(20)" else None

                async def our_op(n: int, limit: int | None = limit) -> object:
                    return await ours.get_items(limit)

                async def their_op(n: int, limit: int | None = limit) -> object:
                    return await theirs.get_items(limit)

            results[name] = await interleave(our_op, their_op, batches, size)
        # Both sides hold the same items, whatever their storage.
        assert await ours.get_items() == await theirs.get_items()
        results["add_items vs store"] = await adapter_overhead(store, ours, history)
        return results, bytes_ratio
    finally:
        theirs.close()
        await store.close()


async def adapter_overhead(store: Store, ours: StatekeeperSession, history: int) -> Ratios:
    """add_items against the store's own append of the same entry to a session as long:
    what the adapter adds (validation, cancel-safety) on top of the store."""
    raw = StatekeeperSession("raw", store)
    await fill(raw, history)
    batches, size = PLAN["add_items"]

    async def our_op(n: int) -> object:
        return await ours.add_items([sdk_item(n)])  # type: ignore[list-item]

    async def store_op(n: int) -> object:
        draft = EntryDraft(kind="item", payload={"item": sdk_item(n)})
        return await store.append_entries(raw.tenant, "raw", [draft])

    return await interleave(our_op, store_op, batches, size)


async def run() -> dict[int, tuple[dict[str, Ratios], float]]:
    """Every operation at every history length."""
    with tempfile.TemporaryDirectory() as tmp:
        return {history: await measure(history, Path(tmp)) for history in HISTORIES}


def report(results: dict[int, tuple[dict[str, Ratios], float]]) -> list[str]:
    """Print the table and the verdicts; return the missed targets."""
    head = f"{'history':>7} {'operation':<18} {'ours us':>10} {'other us':>10}"
    print(f"{head}  ratio median [min-max]")
    verdicts = Verdicts()
    for history, (operations, size) in results.items():
        for name, ratios in operations.items():
            line = f"{history:>7} {name:<18} {ratios.ours_us:>10.1f} {ratios.raw_us:>10.1f}"
            print(f"{line}  ", end="")
            if name == "add_items vs store":  # ours / the store's own append
                verdicts.info("add_items / store.append_entries", list(ratios))
            else:
                verdicts.at_most(f"{name} / SQLiteSession @{history}", list(ratios), TARGET)
        print(f"{history:>7} {'file bytes':<18} {'':>10} {'':>10}  ", end="")
        verdicts.at_most(f"bytes / SQLiteSession's @{history}", size, BYTES_TARGET)
    return [f"openai_agents {name}" for name in verdicts.missed]


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
