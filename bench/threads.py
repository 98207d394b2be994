"""One store object from 8 threads with event loops of their own, against 8 tasks on one loop.

Issue 20: a store runs on its home loop (the loop that opened it); a call from another
loop or thread is handed to statekeeper's background loop (`statekeeper.loops.hand_off`),
where the store keeps its own append engine and connections. The threads must not be
slower than the tasks by more than what that hand-off costs.

Both sides go through the public API: ``store.append_entries(tenant, session_id,
[EntryDraft(payload=message)])``, one entry per call, messages of the realistic mix of
`bench.common`, on one store object opened from a URL on this module's loop:

- **tasks**: ``WRITERS`` tasks on that loop (the home loop), ``PER_WRITER`` appends each;
- **threads**: ``WRITERS`` threads, each with an event loop of its own, doing the same
  through the same store object; the home loop stays idle meanwhile (it awaits the
  threads' end). Threads and their loops are made before the clock starts (a barrier);
- **one thread** (for comparison): the ``WRITERS`` writers as tasks on the loop of one
  other thread: every call handed off, but only two threads (caller and background
  loop) compete for the GIL.

Each layout is measured twice: every writer on a session of its own, and all writers on
one shared session (where group commit and the head's compare-and-set matter). Each
side appends to sessions of its own. The sides take turns (``ROUNDS`` rounds after a
warm-up round, the order reversing every round), each round gives one appends/s per
side; the report shows medians [min-max], and the context switches per append (all
threads of the process, ``getrusage``).

The hand-off's own cost, measured in the same process: the round trip of ``hand_off``
for a coroutine that does nothing, from a foreign loop to the background loop (one
thread calling, and ``WRITERS`` at once); and what a cheap store call costs more from a
foreign thread than on the home loop (`Probe`: ``get_session``, sequential calls, the
two sides alternating): on the memory store, which runs every call on its caller's loop
(nothing added), and, after every round of appends under the same load, on the store
measured (PostgreSQL and Redis hand calls from other loops to the background loop). The
bound: per append, time(threads) <= time(tasks) + the added cost of one call of that
store from a foreign thread (the probes of the same rounds), where time is a round's
wall time over its appends. For a store that needs no hand-off (memory, SQLite, files
run calls on the caller's loop) the bound is what a hand-off costs under the same load
(a bare ``hand_off`` round trip after each round): whichever is larger.

SQLite runs with ``durability=power`` and ``process`` in a temporary folder; PostgreSQL
(``STATEKEEPER_BENCH_POSTGRES_URL``, a throw-away schema) and Redis
(``STATEKEEPER_BENCH_REDIS_URL``, a throw-away key prefix) are skipped, with the reason
printed, when no server answers.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.common import Verdicts, message_dict, reachable, spread
from statekeeper.loops import background_loop, hand_off
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EntryDraft, SessionRecord

POSTGRES_URL = os.environ.get(
    "STATEKEEPER_BENCH_POSTGRES_URL",
    os.environ.get("STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
)
REDIS_URL = os.environ.get("STATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
TENANT = "bench"
WRITERS = 8
PER_WRITER = 12  # appends per writer per round
ROUNDS = 7  # measured rounds per layout (+ 1 warm-up round)
CALLS, CALL_ROUNDS = 200, 7  # hand-off cost: sequential calls per round, rounds
PROBE_CALLS = 50  # get_session calls each way in a probe (see `Probe`)
JOIN_LIMIT = 120.0  # seconds a round's threads may take before the benchmark gives up

Body = Callable[[int], Coroutine[Any, Any, object]]
"""What one writer does, given its number (0 .. WRITERS - 1)."""


# -- timing the sides ---------------------------------------------------------------------


async def on_tasks(count: int, body: Body) -> float:
    """Seconds ``count`` tasks on this loop take to run ``body(i)`` each, together."""
    started = time.perf_counter()
    await asyncio.gather(*(body(i) for i in range(count)))
    return time.perf_counter() - started


def _in_threads(count: int, body: Body) -> float:
    """Seconds ``count`` threads, each running its own event loop, take to run
    ``body(i)`` each, from the first start (all threads ready, their loops made) to the
    last end."""
    ready = threading.Barrier(count + 1, timeout=JOIN_LIMIT)
    started = [0.0] * count
    ended = [0.0] * count
    errors: list[BaseException] = []

    def work(i: int) -> None:
        loop = asyncio.new_event_loop()
        try:
            ready.wait()
            started[i] = time.perf_counter()
            loop.run_until_complete(body(i))
            ended[i] = time.perf_counter()
        except BaseException as exc:
            errors.append(exc)
        finally:
            loop.close()

    threads = [
        threading.Thread(target=work, args=(i,), name=f"bench-writer-{i}", daemon=True)
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    ready.wait()
    for thread in threads:
        thread.join(JOIN_LIMIT)
        if thread.is_alive():
            raise RuntimeError(f"{thread.name} still running after {JOIN_LIMIT} s")
    if errors:
        raise errors[0]
    return max(ended) - min(started)


async def on_threads(count: int, body: Body) -> float:
    """`_in_threads` while this loop (the store's home loop) stays idle."""
    return await asyncio.to_thread(_in_threads, count, body)


async def on_one_thread(count: int, body: Body) -> float:
    """Seconds ``count`` tasks take to run ``body(i)`` each, together, on the event loop
    of one other thread (this loop idle meanwhile): the hand-off without the threads."""

    async def together(_: int) -> None:
        await asyncio.gather(*(body(i) for i in range(count)))

    return await on_threads(1, together)


SIDES = {"tasks": on_tasks, "threads": on_threads, "one thread": on_one_thread}
"""The sides, and how each runs its ``WRITERS`` writers: tasks on the home loop, threads
with loops of their own, tasks on one other thread's loop."""


# -- appends ------------------------------------------------------------------------------


class Numbers:
    """Message numbers handed out in order, so every append carries a different message."""

    def __init__(self) -> None:
        self.next = 0
        self._lock = threading.Lock()

    def take(self, count: int) -> int:
        with self._lock:
            first, self.next = self.next, self.next + count
        return first


async def new_session(store: Store) -> str:
    """A fresh empty session's id."""
    session_id = f"bench-{uuid.uuid4().hex[:16]}"
    await store.create_session(SessionRecord(id=session_id, tenant=TENANT))
    return session_id


def writer(store: Store, sessions: list[str], numbers: Numbers) -> Body:
    """Writer ``i`` appends ``PER_WRITER`` single-entry batches to ``sessions[i]``
    (to ``sessions[0]`` if there is one session only)."""

    async def body(i: int) -> None:
        session_id = sessions[i % len(sessions)]
        first = numbers.take(PER_WRITER)
        for n in range(first, first + PER_WRITER):
            await store.append_entries(TENANT, session_id, [EntryDraft(payload=message_dict(n))])

    return body


def switches() -> int:
    """Context switches of this process so far (voluntary and not), every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


async def appends(store: Store) -> dict[str, dict[str, list[float]]]:
    """Both layouts, the sides taking turns: appends/s per round and side, the process's
    context switches per append (``<side> cs``), and the added cost of a call of this
    store from a foreign thread measured after each round (``bound``)."""
    probe = await Probe.open(store)
    numbers = Numbers()
    results: dict[str, dict[str, list[float]]] = {}
    for layout, per_side in (("own", WRITERS), ("shared", 1)):
        sessions = {side: [await new_session(store) for _ in range(per_side)] for side in SIDES}
        bodies = {side: writer(store, ids, numbers) for side, ids in sessions.items()}
        rates: dict[str, list[float]] = {"bound": []}
        for side in SIDES:
            rates[side], rates[f"{side} cs"] = [], []
        for round_ in range(-1, ROUNDS):
            for side in list(SIDES)[:: 1 if round_ % 2 == 0 else -1]:
                before = switches()
                seconds = await SIDES[side](WRITERS, bodies[side])
                if round_ >= 0:
                    rates[side].append(WRITERS * PER_WRITER / seconds)
                    rates[f"{side} cs"].append((switches() - before) / (WRITERS * PER_WRITER))
            # The hand-off's cost under this round's load: this store's own (PostgreSQL,
            # Redis), or, for a store that runs calls on the caller's loop, what handing a
            # call to another loop costs (the threads may spend that much on contention).
            added = max(await probe.added(), await bare_round_trip())
            if round_ >= 0:
                rates["bound"].append(added)
        for side, ids in sessions.items():  # every append of every round landed
            counts = [(await store.get_session(TENANT, s)).last_seq for s in ids]
            assert sum(counts) == (ROUNDS + 1) * WRITERS * PER_WRITER, (layout, side, counts)
        results[layout] = rates
    return results


# -- the hand-off's cost ------------------------------------------------------------------


async def _nothing() -> None:
    return None


async def bare_round_trip() -> float:
    """Microseconds per ``hand_off`` of a coroutine that does nothing, from one foreign
    thread's loop to the background loop (``PROBE_CALLS`` sequential calls)."""
    target = background_loop()

    async def calls(_: int) -> None:
        for _ in range(PROBE_CALLS):
            await hand_off(_nothing(), target)

    return await on_threads(1, calls) / PROBE_CALLS * 1e6


class Probe:
    """What one ``get_session`` costs more from a foreign thread (its own loop) than on
    the store's home loop (nothing for a store that runs on the caller's loop; the
    hand-off for PostgreSQL and Redis): ``PROBE_CALLS`` sequential calls each way,
    the order alternating from one sample to the next. Taken after every round of
    appends, so that the bound each round is checked against was measured under the
    same load as the round."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.samples = 0

    @classmethod
    async def open(cls, store: Store) -> Probe:
        return cls(store, await new_session(store))

    async def _reads(self, _: int) -> None:
        for _ in range(PROBE_CALLS):
            await self.store.get_session(TENANT, self.session_id)

    async def both(self) -> tuple[float, float]:
        """Microseconds per call: (home loop, foreign thread)."""
        self.samples += 1
        took: dict[str, float] = {}
        for side in ("home", "foreign") if self.samples % 2 else ("foreign", "home"):
            timed = on_tasks if side == "home" else on_threads
            took[side] = await timed(1, self._reads) / PROBE_CALLS * 1e6
        return took["home"], took["foreign"]

    async def added(self) -> float:
        """Microseconds per call: foreign thread minus home loop."""
        home, foreign = await self.both()
        return foreign - home


async def handoff_cost(probe: Probe) -> dict[str, list[float]]:
    """Microseconds: a bare ``hand_off`` round trip from a foreign loop (and the same
    from ``WRITERS`` threads at once: wall time over all their calls); ``get_session`` on
    the memory store on its home loop and from a foreign thread (`Probe`)."""
    target = background_loop()

    async def bare(_: int) -> None:
        for _ in range(CALLS):
            await hand_off(_nothing(), target)

    async def local(_: int) -> None:
        for _ in range(CALLS):
            await _nothing()

    async def bare_share(_: int) -> None:
        for _ in range(CALLS // WRITERS):
            await hand_off(_nothing(), target)

    round_trip: list[float] = []
    awaited: list[float] = []
    together: list[float] = []
    for round_ in range(-1, CALL_ROUNDS):
        seconds = await on_threads(1, bare)
        plain = await on_threads(1, local)
        at_once = await on_threads(WRITERS, bare_share)
        if round_ >= 0:
            round_trip.append(seconds / CALLS * 1e6)
            awaited.append(plain / CALLS * 1e6)
            together.append(at_once / (CALLS // WRITERS * WRITERS) * 1e6)

    home: list[float] = []
    foreign: list[float] = []
    for round_ in range(-1, CALL_ROUNDS):
        on_home, on_foreign = await probe.both()
        if round_ >= 0:
            home.append(on_home)
            foreign.append(on_foreign)
    added = [f - h for f, h in zip(foreign, home, strict=True)]
    return {
        "round_trip": round_trip,
        "awaited": awaited,
        "together": together,
        "home": home,
        "foreign": foreign,
        "added": added,
    }


# -- backends -----------------------------------------------------------------------------


async def on_sqlite(folder: Path, durability: str) -> dict[str, Any]:
    path = folder / f"threads-{durability}.db"
    async with open_store(f"sqlite:///{path}", durability=durability) as store:
        return await appends(store)


async def on_postgres() -> dict[str, Any]:
    import psycopg

    schema = f"skbench_{uuid.uuid4().hex[:12]}"
    try:
        async with open_store(POSTGRES_URL, schema=schema) as store:
            return await appends(store)
    finally:
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


async def on_redis() -> dict[str, Any]:
    from redis.asyncio import Redis

    prefix = f"skbench{uuid.uuid4().hex[:10]}"
    try:
        async with open_store(REDIS_URL, prefix=prefix) as store:
            return await appends(store)
    finally:
        client = Redis.from_url(REDIS_URL)
        async for key in client.scan_iter(match=f"{prefix}/*", count=1000):
            await client.unlink(key)
        await client.aclose()


async def run() -> dict[str, Any]:
    """Every measurement, in one process (None for a backend without a server)."""
    backends: dict[str, Any] = {}
    async with open_store("memory://") as memory:  # opened here: this loop is its home
        probe = await Probe.open(memory)
        results: dict[str, Any] = {"handoff": await handoff_cost(probe), "backends": backends}
        with tempfile.TemporaryDirectory(prefix="statekeeper-bench-") as folder:
            for durability in ("power", "process"):
                backends[f"sqlite {durability}"] = await on_sqlite(Path(folder), durability)
        for name, url, port, measure in (
            ("postgres", POSTGRES_URL, 5432, on_postgres),
            ("redis", REDIS_URL, 6379, on_redis),
        ):
            reason = await reachable(url, port)
            if reason is not None:
                print(f"{name} skipped: {reason}")
                backends[name] = None
                continue
            backends[name] = await measure()
    return results


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(results: dict[str, Any]) -> list[str]:
    """Print the tables and the verdicts; return the missed targets."""
    cost = results["handoff"]
    rows = [
        ("bare hand_off round trip (no-op coroutine)", cost["round_trip"]),
        ("the same coroutine awaited on its own loop", cost["awaited"]),
        (f"bare hand_off from {WRITERS} threads at once", cost["together"]),
        ("memory get_session on the home loop", cost["home"]),
        ("memory get_session from a foreign thread", cost["foreign"]),
        ("added per memory call (runs on the caller's loop)", cost["added"]),
    ]
    print(f"hand-off, us per call, {CALL_ROUNDS} rounds: median [min-max]")
    for name, values in rows:
        print(f"  {name:<46} {spread(values):>22}")
    print()
    print(
        f"{WRITERS} writers x {PER_WRITER} single-entry appends per round, {ROUNDS} rounds, "
        "medians. us: wall time per append (tasks; threads; one thread running 8 tasks). "
        "bound: tasks us + the added cost of a store call from a foreign thread, measured "
        "after each round. cs: context switches per append"
    )
    print(
        f"{'backend':<15} {'sessions':<8} {'tasks/s':>7} {'threads/s':>9} "
        f"{'threads/tasks':>20} {'tasks':>5} {'thr.':>5} {'1 thr':>5} {'bound':>5} "
        f"{'cs tasks':>8} {'thr.':>5} {'1 thr':>5}"
    )
    checks: list[tuple[str, list[float], list[float], float]] = []
    for backend, layouts in results["backends"].items():
        if layouts is None:
            print(f"{backend:<15} (skipped: no server)")
            continue
        for layout, rates in layouts.items():
            tasks, threads, one = rates["tasks"], rates["threads"], rates["one thread"]
            ratios = [t / k for t, k in zip(threads, tasks, strict=True)]
            added = _median(rates["bound"])
            us = [1e6 / _median(side) for side in (tasks, threads, one)]
            print(
                f"{backend:<15} {layout:<8} {_median(tasks):>7.0f} {_median(threads):>9.0f} "
                f"{spread(ratios):>20} {us[0]:>5.0f} {us[1]:>5.0f} {us[2]:>5.0f} "
                f"{us[0] + added:>5.0f} {_median(rates['tasks cs']):>8.1f} "
                f"{_median(rates['threads cs']):>5.1f} {_median(rates['one thread cs']):>5.1f}"
            )
            excess = [1e6 / t - 1e6 / k for t, k in zip(threads, tasks, strict=True)]
            one_excess = [1e6 / t - 1e6 / k for t, k in zip(one, tasks, strict=True)]
            checks.append((f"{backend}, {layout}", excess, one_excess, added))
    print()
    print(
        "bound: per append, time(threads) - time(tasks) <= the cost of a hand-off (the "
        "store's own from a foreign thread, or a bare hand_off round trip, whichever is "
        "larger), measured after the same rounds (us, per round: median [min-max]); one "
        "thread running the 8 writers as tasks for comparison:"
    )
    verdicts = Verdicts()
    for name, excess, one_excess, added in checks:
        verdicts.at_most(f"{name}: threads - tasks", excess, round(added))
        verdicts.info(f"{name}: one thread - tasks", one_excess)
    return verdicts.missed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
