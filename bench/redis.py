"""Append throughput of the Redis store against raw redis-py, in one process.

Three scenarios, each run with our store and with the baseline in the same run:
- 1 writer on 1 session;
- 8 concurrent writers, each on its own session;
- 8 concurrent writers on the same session.

Ours: ``store.append_entries`` of one ~500-byte chat message with a ``message_count``
counter patch (a compare-and-set append: entry, id index, head and listing index in one
script). Raw: redis-py's asyncio client writing the same payload comparably, as a
MULTI/EXEC of INCR (the seq) and HSET (the payload under that writer's next field), one
transaction per append. Both use one client (connection pool) per side, no pipelining
across appends. Each figure is the best of three rounds; the target is raw / ours <= 2.

The server is ``STATEKEEPER_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``);
every key is written under a fresh prefix and deleted afterwards. Run it as a module
(``python -m bench.redis``): as a script, this file would shadow the ``redis`` package.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from statekeeper.core.messages import Message
from statekeeper.jsoncodec import encode_json
from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionPatch, SessionRecord, Store

URL = os.environ.get("STATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
APPENDS = 1_600
ROUNDS = 3
TARGET = 2.0
SCENARIOS = (("1 writer, 1 session", 1, False), ("8 writers, 8 sessions", 8, False))
SCENARIOS += (("8 writers, 1 session", 8, True),)
TEXT = (
    "The customer asked about order {n}: it left the depot on Tuesday, the carrier "
    "expects delivery on Thursday, and a replacement can be sent once the carrier "
    "confirms the parcel is lost. They also asked whether the confirmation e-mail goes "
    "to the address on the order, which it does. "
)
_PATCH = SessionPatch(add={"message_count": 1})


def payload(n: int) -> dict[str, object]:
    """A realistic chat message of about 500 bytes of JSON."""
    return Message(role="user" if n % 2 else "assistant", content=TEXT.format(n=n)).to_dict()


async def _timed(writers: int, write: Callable[[int, int], Awaitable[object]]) -> float:
    """Appends per second of ``writers`` concurrent loops calling ``write(writer, n)``."""
    each = APPENDS // writers

    async def loop(writer: int) -> None:
        for n in range(each):
            await write(writer, n)

    start = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(writers)))
    return each * writers / (time.perf_counter() - start)


async def ours(store: Store, round_id: str, writers: int, same: bool) -> float:
    sessions = [f"{round_id}-s{w}" for w in range(1 if same else writers)]
    for session_id in sessions:
        await store.create_session(SessionRecord(id=session_id, tenant="bench"))
    bodies = [payload(n) for n in range(APPENDS)]

    async def write(writer: int, n: int) -> object:
        draft = EntryDraft(payload=bodies[n])
        session_id = sessions[0 if same else writer]
        return await store.append_entries("bench", session_id, [draft], patch=_PATCH)

    return await _timed(writers, write)


async def raw(client: Redis, prefix: str, writers: int, same: bool) -> float:
    texts = [encode_json(payload(n)) for n in range(APPENDS)]

    async def write(writer: int, n: int) -> object:
        key = f"{prefix}/raw/{0 if same else writer}"
        async with client.pipeline(transaction=True) as pipe:
            pipe.incr(f"{key}/seq")
            pipe.hset(f"{key}/entries", f"{writer}-{n}", texts[n])
            return await pipe.execute()

    return await _timed(writers, write)


async def _clean(client: Redis, prefix: str) -> None:
    async for key in client.scan_iter(match=f"{prefix}/*", count=1000):
        await client.unlink(key)


async def run() -> list[tuple[str, dict[str, float]]]:
    """Every measurement, in one process (ours and raw interleaved, best of three)."""
    prefix = f"skbench{uuid.uuid4().hex[:10]}"
    store = await open_store(URL, prefix=prefix)
    client = Redis.from_url(URL, protocol=2)
    results = []
    try:
        for name, writers, same in SCENARIOS:
            best = {"ours": 0.0, "raw": 0.0}
            for attempt in range(ROUNDS):
                round_id = f"{writers}{'same' if same else 'many'}{attempt}"
                best["ours"] = max(best["ours"], await ours(store, round_id, writers, same))
                best["raw"] = max(
                    best["raw"], await raw(client, f"{prefix}/{round_id}", writers, same)
                )
                await _clean(client, prefix)
            results.append((name, best))
    finally:
        await _clean(client, prefix)
        await client.aclose()
        await store.close()
    return results


def report(results: list[tuple[str, dict[str, float]]]) -> list[str]:
    """Print the table and the verdicts; return the failed targets."""
    print(f"{'scenario':<24} {'ours/s':>9} {'raw/s':>9} {'raw/ours':>9}")
    failed = []
    for name, r in results:
        ratio = r["raw"] / r["ours"]
        verdict = "ok" if ratio <= TARGET else "MISSED"
        print(
            f"{name:<24} {r['ours']:>9.0f} {r['raw']:>9.0f} {ratio:>9.2f}  "
            f"(target <= {TARGET})  {verdict}"
        )
        if ratio > TARGET:
            failed.append(f"redis append, {name}")
    return failed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
