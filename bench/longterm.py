"""Long-term store: `StatekeeperStore` on SQLite vs LangGraph's own `AsyncSqliteStore`.

Both sides are LangGraph ``BaseStore``s holding the same items: N in 100 namespaces
``("memories", "u<k>")`` (N = 10 and 10,000). Timed through ``BaseStore``'s async
methods, the sides taking turns (`bench.common.interleave`): update an item, get one,
search all N by a filter (``kind == 3``, limit 10: found early), search by a filter
only the last 3 items match (every item read), list the namespaces. Ours runs with
``durability=power`` (fsync per commit; LangGraph's store uses SQLite's default rollback
journal, which also syncs) and ``process``.

Semantic search (limit 10 over all N, a deterministic 64-number embedding of ``text``)
is compared with LangGraph's ``InMemoryStore`` instead: its SQLite store needs the
sqlite-vec extension, which this Python's sqlite3 cannot load.

Figures, no targets: search reads every item under its prefix on our side (see
docs/longterm.md, "The scale it is meant for"), where LangGraph's SQLite store filters
in SQL, so the search rows show what that costs at 10,000 items.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Verdicts, interleave

SIZES = (10, 10_000)
DIMS = 64
NAMESPACES = 100


def embed(texts: Sequence[str]) -> list[list[float]]:
    """A cheap deterministic embedding (the model is not what is measured)."""
    return [[((i * 31 + ord(t[i % len(t)])) % 17) / 17.0 for i in range(DIMS)] for t in texts]


def item(n: int) -> tuple[tuple[str, ...], str, dict[str, Any]]:
    namespace = ("memories", f"u{n % NAMESPACES}")
    return namespace, f"m{n}", {"text": f"memory {n} about topic {n % 37}", "kind": n % 5, "n": n}


async def fill(store: Any, size: int) -> None:
    from langgraph.store.base import PutOp

    for start in range(0, size, 500):
        await store.abatch([PutOp(*item(n)) for n in range(start, min(size, start + 500))])


async def measure(
    ours: Any, theirs: Any, size: int, ops: dict[str, Any]
) -> dict[str, tuple[float, float, float]]:
    """Per operation: (our µs, their µs, median ratio)."""
    await fill(ours, size)
    await fill(theirs, size)
    rows = {}
    for name, make in ops.items():
        heavy = size > 1000 and name.startswith("search")
        batches, batch_size = (3, 2) if heavy else (5, 20)
        ratios = await interleave(make(ours, size), make(theirs, size), batches, batch_size)
        rows[name] = (ratios.ours_us, ratios.raw_us, sorted(ratios)[len(ratios) // 2])
    return rows


PLAIN_OPS = {
    "put (update)": lambda s, size: lambda n: s.aput(*item(n % size)),
    "get": lambda s, size: lambda n: s.aget(*item(n % size)[:2]),
    "search filter": lambda s, size: lambda n: s.asearch(("memories",), filter={"kind": 3}),
    "search scan all": lambda s, size: (
        lambda n: s.asearch(("memories",), filter={"n": {"$gte": size - 3}})
    ),
    "list_namespaces": lambda s, size: lambda n: s.alist_namespaces(prefix=("memories",)),
}
QUERY_OPS = {
    "search query": lambda s, size: lambda n: s.asearch(("memories",), query=f"topic {n % 37}"),
}


async def run() -> list[tuple[str, int, dict[str, tuple[float, float, float]]]]:
    """Every measurement, in one process."""
    from langgraph.store.memory import InMemoryStore
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    from statekeeper import open_store
    from statekeeper.integrations.langgraph.store import StatekeeperStore

    index = {"dims": DIMS, "embed": embed, "fields": ["text"]}
    results = []
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-longterm-") as folder:
        for durability in ("power", "process"):
            for size in SIZES:
                base = Path(folder) / f"{durability}-{size}"
                url = f"sqlite:///{base}-ours.db?durability={durability}"
                async with (
                    open_store(url) as store,
                    AsyncSqliteStore.from_conn_string(f"{base}-lg.db") as theirs,
                ):
                    await theirs.setup()
                    ours = StatekeeperStore(store, tenant="bench")
                    rows = await measure(ours, theirs, size, PLAIN_OPS)
                    if durability == "power":
                        indexed = StatekeeperStore(store, tenant="bench", name="vec", index=index)
                        rows |= await measure(indexed, InMemoryStore(index=index), size, QUERY_OPS)
                    results.append((durability, size, rows))
    return results


def report(results: list[tuple[str, int, dict[str, tuple[float, float, float]]]]) -> list[str]:
    """Print the table; there are no targets, so nothing fails."""
    print(f"{'durability':<10} {'items':>6} {'operation':<16} {'ours us':>10} {'LG us':>10} ratio")
    for durability, size, rows in results:
        for name, (ours_us, raw_us, ratio) in rows.items():
            line = f"{durability:<10} {size:>6} {name:<16} {ours_us:>10.0f} {raw_us:>10.0f}"
            print(f"{line} {ratio:5.2f}")
    verdicts = Verdicts()
    by = {(d, s): rows for d, s, rows in results}
    for name in ("put (update)", "get", "search scan all", "search query"):
        small, large = by["power", SIZES[0]][name][0], by["power", SIZES[-1]][name][0]
        verdicts.info(f"ours {name}: at 10k / at 10", large / small)
    return verdicts.missed
