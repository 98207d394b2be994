"""`StatekeeperStore`: LangGraph's long-term ``BaseStore`` over any statekeeper store.

    store = StatekeeperStore(await open_store("sqlite:///state.db"), tenant="my-app")
    graph = builder.compile(store=store)

Every operation goes to `statekeeper.longterm.LongTermStore` (one tenant, record namespace
``ltm.<name>``), so items are JSON records on whichever backend was opened, and TTLs,
filters and semantic search behave the same on all of them. As LangGraph's own stores do,
a batch runs its reads first and then its writes (the last write of a key wins).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    validate_op_namespace,
)

from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.longterm import LongTermStore, MemoryItem
from statekeeper.stores.base import RecordStore
from statekeeper.sync import blocking

__all__ = ["StatekeeperStore"]


class StatekeeperStore(BaseStore):
    """A LangGraph ``BaseStore`` keeping items in a statekeeper store, for one tenant.

    ``index`` is LangGraph's ``{"dims": ..., "embed": ..., "fields": [...]}`` (semantic
    search); ``ttl`` is its ``{"default_ttl": minutes, "refresh_on_read": bool}``. Make it
    inside the event loop that opened ``store``: the sync methods (``put``, ``get``,
    a graph's ``invoke``) then run on that loop from other threads. Made outside any
    loop, they run on `statekeeper.sync`'s loop (open the store with ``blocking``).
    """

    supports_ttl = True

    def __init__(
        self,
        store: RecordStore,
        *,
        tenant: str,
        name: str = "langgraph",
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        self.index_config = dict(index) if index else None
        self.ttl_config = ttl
        embed = embed_query = None
        fields: Sequence[str] = ("$",)
        dims = None
        if index:
            embeddings = ensure_embeddings(index.get("embed"))

            async def embed(texts: Sequence[str]) -> list[list[float]]:
                return await embeddings.aembed_documents(list(texts))

            async def embed_query(texts: Sequence[str]) -> list[list[float]]:
                return [await embeddings.aembed_query(text) for text in texts]

            fields = index.get("fields") or ("$",)
            dims = index.get("dims")
        self.memory = LongTermStore(
            store,
            tenant=tenant,
            name=name,
            embed=embed,
            embed_query=embed_query,
            fields=fields,
            dims=dims,
            default_ttl=(ttl or {}).get("default_ttl"),  # checked here; ops carry their ttl
            refresh_on_read=(ttl or {}).get("refresh_on_read", True),
        )
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # -- BaseStore -----------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` from synchronous code (on the loop the store was made in)."""
        if self._loop is None:
            return blocking.run(self.abatch(ops))
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise StatekeeperError(
                "StatekeeperStore's sync methods were called on the event loop that runs "
                "the store, which would block it: use the async ones (aget, aput, asearch, "
                "graph.ainvoke) there"
            )
        return asyncio.run_coroutine_threadsafe(self.abatch(ops), self._loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops``: reads first (concurrently), then the writes, last write per key."""
        ops = list(ops)
        for op in ops:
            if not isinstance(op, GetOp | SearchOp | ListNamespacesOp | PutOp):
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
            validate_op_namespace(op)
        for op in ops:  # every put checked first: one bad item writes nothing
            if isinstance(op, PutOp) and op.value is not None:
                self.memory.check_put(op.namespace, op.key, op.value, ttl=op.ttl)
        reads = {i: op for i, op in enumerate(ops) if not isinstance(op, PutOp)}
        answers = await asyncio.gather(*(self._read(op) for op in reads.values()))
        results: list[Result] = [None] * len(ops)
        for i, answer in zip(reads, answers, strict=True):
            results[i] = answer
        writes = {(op.namespace, op.key): op for op in ops if isinstance(op, PutOp)}
        await asyncio.gather(*(self._write(op) for op in writes.values()))
        return results

    # -- one operation -------------------------------------------------------------------

    async def _read(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            got = await self.memory.get(op.namespace, op.key, refresh_ttl=op.refresh_ttl)
            return None if got is None else _item(got)
        if isinstance(op, SearchOp):
            found = await self.memory.search(
                op.namespace_prefix,
                filter=op.filter,
                query=op.query if self.index_config else None,  # as LangGraph: else ignored
                limit=op.limit,
                offset=op.offset,
                refresh_ttl=op.refresh_ttl,
            )
            return [_search_item(hit) for hit in found]
        assert isinstance(op, ListNamespacesOp)
        return await self._list_namespaces(op)

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        paths: dict[str, tuple[str, ...]] = {}
        for condition in op.match_conditions or ():
            if condition.match_type in paths:
                raise InvalidInputError(
                    f"list_namespaces takes one {condition.match_type} condition, not several"
                )
            paths[condition.match_type] = tuple(condition.path)
        return await self.memory.list_namespaces(
            prefix=paths.get("prefix", ()),
            suffix=paths.get("suffix", ()),
            max_depth=op.max_depth,
            limit=op.limit,
            offset=op.offset,
        )

    async def _write(self, op: PutOp) -> None:
        if op.value is None:
            await self.memory.delete(op.namespace, op.key)
            return
        index: bool | list[str] | None = False  # without an index config, as LangGraph: none
        if self.index_config:
            index = op.index if op.index is None or op.index is False else list(op.index)
        await self.memory.put(op.namespace, op.key, op.value, index=index, ttl=op.ttl)


def _item(found: MemoryItem) -> Item:
    return Item(
        value=found.value,
        key=found.key,
        namespace=found.namespace,
        created_at=found.created_at,
        updated_at=found.updated_at,
    )


def _search_item(found: MemoryItem) -> SearchItem:
    return SearchItem(
        namespace=found.namespace,
        key=found.key,
        value=found.value,
        created_at=found.created_at,
        updated_at=found.updated_at,
        score=found.score,
    )
