"""Long-term store: `StatekeeperStore` on SQLite vs LangGraph's own `AsyncSqliteStore`.

Both sides are LangGraph ``BaseStore``s holding the same items: N in 100 namespaces
``("memories", "u<k>")`` (N = 10 and 10,000). Timed through ``BaseStore``'s async
methods at their defaults, the sides taking turns (`bench.common.interleave`): update an
item, get one, search all N by a filter (``kind == 3``, limit 10: 2,000 match), search
by a filter only the last 3 items match (every item's value is looked at), list the
namespaces. Ours runs with ``durability=power`` (fsync per commit) and ``process``;
LangGraph's file gets ``PRAGMA synchronous=FULL`` (its default journal already syncs
each commit), the one setting equalized. Searches at 10,000 items take 15 turns of 4
(semantic: 7 of 2), the rest 7 of 20.

Semantic search (limit 10 over all N, a deterministic 64-number embedding of ``text``)
is compared with LangGraph's ``InMemoryStore`` (pure Python scoring: NumPy is not
installed): its SQLite store keeps vectors with the sqlite-vec extension, and this
Python's ``sqlite3`` cannot load extensions (no ``enable_load_extension``), so
``AsyncSqliteStore(index=...)`` fails here.

Targets at 10,000 items (``durability=power``): both filter searches and
``list_namespaces`` no slower than ``AsyncSqliteStore`` (ours / theirs <= 1.0, median).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Ratios, Verdicts, interleave, spread

SIZES = (10, 10_000)
DIMS = 64
NAMESPACES = 100
TARGETS = ("search filter", "search scan all", "list_namespaces")
Rows = dict[str, Ratios]


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


async def measure(ours: Any, theirs: Any, size: int, ops: dict[str, Any]) -> Rows:
    """Per operation: the per-batch ratios (ours / theirs), with both sides' mean µs."""
    await fill(ours, size)
    await fill(theirs, size)
    rows = {}
    for name, make in ops.items():
        batches, batch_size = 7, 20
        if size > 1000 and name.startswith("search"):  # the targets: more turns, the
            batches, batch_size = (7, 2) if "query" in name else (15, 4)  # machine is noisy
        rows[name] = await interleave(make(ours, size), make(theirs, size), batches, batch_size)
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


async def synchronous_full(theirs: Any) -> None:
    """LangGraph's connection with ``synchronous=FULL`` (durability equalized)."""
    await theirs.conn.execute("PRAGMA synchronous=FULL")


async def run() -> list[tuple[str, int, Rows]]:
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
                    await synchronous_full(theirs)
                    ours = StatekeeperStore(store, tenant="bench")
                    rows = await measure(ours, theirs, size, PLAIN_OPS)
                    if durability == "power":
                        indexed = StatekeeperStore(store, tenant="bench", name="vec", index=index)
                        rows |= await measure(indexed, InMemoryStore(index=index), size, QUERY_OPS)
                    results.append((durability, size, rows))
    return results


def report(results: list[tuple[str, int, Rows]]) -> list[str]:
    """Print the table and one verdict per target; return the missed ones."""
    print(f"{'durability':<10} {'items':>6} {'operation':<16} {'ours us':>10} {'LG us':>10} ratio")
    for durability, size, rows in results:
        for name, ratios in rows.items():
            line = f"{durability:<10} {size:>6} {name:<16} {ratios.ours_us:>10.0f}"
            print(f"{line} {ratios.raw_us:>10.0f} {spread(list(ratios))}")
    verdicts = Verdicts()
    by = {(d, s): rows for d, s, rows in results}
    large = by["power", SIZES[-1]]
    for name in TARGETS:
        verdicts.at_most(f"{name} at 10k, ours / AsyncSqliteStore", list(large[name]), 1.0)
    verdicts.info("search query at 10k, ours / InMemoryStore", list(large["search query"]))
    for name in ("put (update)", "get", "search scan all", "search query"):
        small = by["power", SIZES[0]][name].ours_us
        verdicts.info(f"ours {name}: at 10k / at 10", large[name].ours_us / small)
    return verdicts.missed
