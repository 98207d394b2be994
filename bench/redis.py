"""Sessions on Redis against the plainest raw redis-py code doing the same job.

Our side goes through the public API only: ``Session.append(message)`` (one message per
call) and ``Session.messages()`` of a `SessionManager` (``max_messages=None``) on
``open_store("redis://...", prefix=...)``. The baseline is what a developer writes
without us: redis-py's asyncio client, ``RPUSH key json.dumps(message_dict)`` per
message, and loading is ``LRANGE key 0 -1`` plus ``json.loads`` of each item.
Both sides use redis-py's asyncio client against the same server.

Messages are the realistic mix of `bench.common` (two ~400 B chat turns, then a ~2 KB
tool output). Each measured append adds one message to a session that already holds
``HISTORY`` messages (filled in batches first). The two sides take turns in batches;
each batch gives one ratio (ours time / raw time), reported as median [min-max]. Memory
(``MEMORY USAGE`` of every key of each side) is compared with the payload, the JSON of
the messages. Appends must stay O(1): ours at ``HISTORY`` messages against ours at 10
(interleaved the same way; each batch of the short side appends to a session of its
own that holds 10 messages, so every short append lands at 10 to 10 + ``O1_BATCH``),
and O(1) in the head's size: appends to a session holding ``HEAD_STATE`` bytes of state
against appends to one without, interleaved the same way.
Extra information: 8 writers on 8 sessions against 8 raw writers on 8
lists, one round of ``PER_WRITER`` appends each per ratio.

The server is ``STATEKEEPER_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``);
every key is written under a fresh prefix and deleted afterwards. Run it as a module
(``python -m bench redis``): as a script, this file would shadow the ``redis`` package.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

from redis.asyncio import Redis

from bench.common import (
    Ratios,
    Verdicts,
    as_message,
    interleave,
    message_dict,
    payload_bytes,
    spread,
)
from statekeeper.sessions import Session, SessionManager
from statekeeper.stores import open_store

URL = os.environ.get("STATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
HISTORY = 10_000
FILL = 500  # messages per append while filling the history
BATCHES, BATCH = 20, 50  # measured appends: BATCHES * BATCH per side (+ 1 warm-up batch)
O1_BATCHES, O1_BATCH = 10, 20  # ours at HISTORY vs ours at 10 (+ 1 warm-up batch)
SHORT = 10
LOADS = 7
WRITERS, PER_WRITER, ROUNDS = 8, 40, 5
HEAD_STATE = 50_000  # bytes of session state (incompressible) for the head-size check
TARGETS = {"append": 1.5, "growth": 1.5, "head_size": 1.5}
"""Upper limits: ours / raw at ``HISTORY`` messages (issue 9), and ours at ``HISTORY`` /
ours at ``SHORT`` messages (appends are O(1) in the history's length)."""


async def memory(client: Redis, pattern: str) -> int:
    """Bytes Redis holds for every key matching ``pattern`` (``MEMORY USAGE``, exact)."""
    total = 0
    async for key in client.scan_iter(match=pattern, count=1000):
        total += await client.memory_usage(key, samples=0) or 0
    return total


async def clean(client: Redis, pattern: str) -> None:
    """Delete every key matching ``pattern``."""
    async for key in client.scan_iter(match=pattern, count=1000):
        await client.unlink(key)


async def measure(client: Redis, prefix: str) -> dict[str, Any]:
    """Append, load and memory at ``HISTORY`` messages, then the concurrent writers."""
    raw_key = f"{prefix}-raw/s1"
    filler = [message_dict(n) for n in range(HISTORY)]
    appended = (BATCHES + 1) * BATCH
    fresh = [message_dict(HISTORY + n) for n in range(appended)]
    async with open_store(URL, prefix=prefix) as store:
        manager = SessionManager(store, "bench", max_messages=None)
        session = await manager.create()
        for start in range(0, HISTORY, FILL):
            chunk = filler[start : start + FILL]
            await session.append(*(as_message(d) for d in chunk))
            await client.rpush(raw_key, *(json.dumps(d) for d in chunk))

        async def ours(n: int) -> None:  # our side builds its message from the dict
            await session.append(as_message(fresh[n]))

        async def raw(n: int) -> None:
            await client.rpush(raw_key, json.dumps(fresh[n]))

        append = await interleave(ours, raw, BATCHES, BATCH)

        loaded: list[Any] = []

        async def ours_load(n: int) -> None:
            loaded[:] = await session.messages()

        async def raw_load(n: int) -> None:
            loaded[:] = [json.loads(text) for text in await client.lrange(raw_key, 0, -1)]

        load = await interleave(ours_load, raw_load, LOADS, 1)
        assert len(loaded) == HISTORY + appended
        assert len(await session.messages()) == HISTORY + appended

        payload = payload_bytes(filler + fresh)
        bytes_ours = await memory(client, f"{prefix}/*") / payload
        bytes_raw = await memory(client, f"{prefix}-raw/*") / payload

        growth = await o1(manager, session, appended)  # after the loads: they compare sizes
        head_size = await heavy_head(manager)
        concurrent = await writers(manager, client, f"{prefix}-raw")
    return {
        "append": append,
        "growth": growth,
        "head_size": head_size,
        "load": load,
        "concurrent": concurrent,
        "bytes": {"ours": bytes_ours, "raw": bytes_raw},
    }


async def o1(manager: SessionManager, long: Session, first: int) -> Ratios:
    """Ours at ``HISTORY`` messages against ours at ``SHORT``: one short session per batch."""
    shorts = [await manager.create() for _ in range(O1_BATCHES + 1)]
    for short in shorts:
        await short.append(*(as_message(message_dict(n)) for n in range(SHORT)))
    count = (O1_BATCHES + 1) * O1_BATCH
    fresh = [message_dict(HISTORY + first + n) for n in range(count)]

    async def at_history(n: int) -> None:
        await long.append(as_message(fresh[n]))

    async def at_short(n: int) -> None:
        await shorts[n // O1_BATCH].append(as_message(fresh[n]))

    return await interleave(at_history, at_short, O1_BATCHES, O1_BATCH)


async def heavy_head(manager: SessionManager) -> Ratios:
    """Appends to a session holding ``HEAD_STATE`` bytes of state against appends to one
    without: O(1) in the head's size (an append stores the head's live fields only)."""
    heavy, light = await manager.create(), await manager.create()
    await heavy.state.update({"notes": os.urandom(HEAD_STATE // 2).hex()})
    fresh = [message_dict(n) for n in range((O1_BATCHES + 1) * O1_BATCH)]

    async def ours_heavy(n: int) -> None:
        await heavy.append(as_message(fresh[n]))

    async def ours_light(n: int) -> None:
        await light.append(as_message(fresh[n]))

    ratios = await interleave(ours_heavy, ours_light, O1_BATCHES, O1_BATCH)
    await heavy.delete()
    await light.delete()
    return ratios


async def writers(manager: SessionManager, client: Redis, raw_prefix: str) -> Ratios:
    """``WRITERS`` tasks on as many sessions against as many raw writers on as many lists."""
    sessions: list[Session] = [await manager.create() for _ in range(WRITERS)]
    keys = [f"{raw_prefix}/w{w}" for w in range(WRITERS)]
    dicts = [message_dict(n) for n in range(PER_WRITER)]

    async def ours_writer(session: Session) -> None:
        for data in dicts:
            await session.append(as_message(data))

    async def raw_writer(key: str) -> None:
        for data in dicts:
            await client.rpush(key, json.dumps(data))

    async def ours(n: int) -> None:
        await asyncio.gather(*(ours_writer(s) for s in sessions))

    async def raw(n: int) -> None:
        await asyncio.gather(*(raw_writer(k) for k in keys))

    return await interleave(ours, raw, ROUNDS, 1)


async def run() -> dict[str, Any]:
    """Every measurement, in one process; every key is deleted afterwards."""
    prefix = f"skbench{uuid.uuid4().hex[:10]}"
    client = Redis.from_url(URL)
    try:
        return await measure(client, prefix)
    finally:
        await clean(client, f"{prefix}/*")
        await clean(client, f"{prefix}-raw/*")
        await client.aclose()


def report(results: dict[str, Any]) -> list[str]:
    """Print the table and the verdicts; return the missed targets."""
    rows = [
        (f"append at {HISTORY:,}", results["append"]),
        (f"ours at {HISTORY:,} / at {SHORT}", results["growth"]),
        (f"append, {HEAD_STATE // 1000} KB state vs none", results["head_size"]),
        (f"load {HISTORY + (BATCHES + 1) * BATCH:,} messages", results["load"]),
        (f"{WRITERS} writers x {PER_WRITER} appends", results["concurrent"]),
    ]
    print(f"{'operation':<28} {'ours ms':>9} {'raw ms':>9} {'ours/raw':>20}")
    for name, r in rows:
        print(f"{name:<28} {r.ours_us / 1e3:>9.3f} {r.raw_us / 1e3:>9.3f} {spread(r):>20}")
    print()
    verdicts = Verdicts()
    verdicts.at_most(f"append at {HISTORY:,} vs raw RPUSH", results["append"], TARGETS["append"])
    verdicts.at_most(
        f"ours: append at {HISTORY:,} / at {SHORT}", results["growth"], TARGETS["growth"]
    )
    verdicts.at_most(
        f"append, {HEAD_STATE // 1000} KB state / none (O(1))",
        results["head_size"],
        TARGETS["head_size"],
    )
    verdicts.info("load vs LRANGE + json.loads", results["load"])
    verdicts.info(f"{WRITERS} writers on {WRITERS} sessions vs raw", results["concurrent"])
    verdicts.info("memory / payload, ours", results["bytes"]["ours"])
    verdicts.info("memory / payload, raw", results["bytes"]["raw"])
    return verdicts.missed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
