"""`StatekeeperSaver`: a LangGraph checkpointer on any statekeeper store.

    async with open_store("sqlite:///state.db") as store:
        graph = builder.compile(checkpointer=StatekeeperSaver(store))
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t1"}})

or, from synchronous code, ``with StatekeeperSaver.from_url("sqlite:///state.db") as saver``.
Lists that grow by appending (``MessagesState``'s messages) are stored as deltas: a
step writes only the messages it added, once. Values are JSON (LangChain messages as their
fields), or LangGraph's msgpack bytes in base64; pickle is refused. See
docs/integrations/langgraph-checkpointer.md.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Collection, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.integrations.langgraph import _prune, _reads
from statekeeper.integrations.langgraph._ops import CheckpointLog
from statekeeper.integrations.langgraph._values import PickleRefusedError, ValueCodec
from statekeeper.stores import Store, open_store

__all__ = ["PickleRefusedError", "StatekeeperSaver"]

T = TypeVar("T")


class StatekeeperSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer (sync and async) over a statekeeper `Store`.

    Make it inside the event loop the store was opened on; its async methods run there,
    and its sync methods may be called from any other thread (not from that loop's own
    thread, which they would block: use the async methods there). ``tenant`` scopes
    every thread it reads or writes. ``serde`` must not fall back to pickle
    (`PickleRefusedError`).
    """

    def __init__(
        self,
        store: Store,
        *,
        tenant: str = "default",
        serde: SerializerProtocol | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(serde=serde)
        validate_id(tenant, "tenant")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise InvalidInputError(
                    "StatekeeperSaver(store) must be made inside the event loop that opened "
                    "the store; from synchronous code use StatekeeperSaver.from_url(url)"
                ) from None
        self.store = store
        self.tenant = tenant
        self._loop = loop
        self._log = CheckpointLog(store, tenant, ValueCodec(self.serde))

    # -- making one ----------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def afrom_url(
        cls, url: str, *, tenant: str = "default", serde: SerializerProtocol | None = None
    ) -> AsyncIterator[StatekeeperSaver]:
        """Open the store at ``url`` on the running loop; close it on the way out."""
        async with open_store(url) as store:
            yield cls(store, tenant=tenant, serde=serde)

    @classmethod
    @contextmanager
    def from_url(
        cls, url: str, *, tenant: str = "default", serde: SerializerProtocol | None = None
    ) -> Iterator[StatekeeperSaver]:
        """For synchronous code: the store runs on a private event loop thread."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="statekeeper-lg", daemon=True)
        thread.start()

        async def opened() -> Store:
            return await open_store(url)

        try:
            store = asyncio.run_coroutine_threadsafe(opened(), loop).result()
            try:
                yield cls(store, tenant=tenant, serde=serde, loop=loop)
            finally:
                asyncio.run_coroutine_threadsafe(store.close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    # -- running on the store's loop -----------------------------------------------------

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _block(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise StatekeeperError(
                "a sync StatekeeperSaver method was called on the event loop its store runs "
                "on, which it would block; use the async method (aget_tuple, aput, ...) "
                "or graph.ainvoke there"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- async API -----------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint a config names (its latest if it names none), or None."""
        return await self._on_loop(_reads.get_tuple(self._log, config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, filtered by metadata equality, before a checkpoint."""
        found = await self._on_loop(
            _reads.list_checkpoints(self._log, config, filter, before, limit)
        )
        for build in found:
            yield build()

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: the values that changed (appended lists as deltas)."""
        return await self._on_loop(self._log.put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes; the first write of a (task, index) wins."""
        await self._on_loop(self._log.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and writes in every namespace."""
        await self._on_loop(_prune.delete_thread(self._log, thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) the given runs made."""
        await self._on_loop(_prune.delete_for_runs(self._log, run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another thread."""
        await self._on_loop(_prune.copy_thread(self._log, source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's latest checkpoint (and the values it
        needs); ``delete``: delete the threads."""
        await self._on_loop(_prune.prune(self._log, thread_ids, strategy))

    # -- sync API ------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync `aget_tuple`."""
        return self._block(_reads.get_tuple(self._log, config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync `alist`."""
        found = self._block(_reads.list_checkpoints(self._log, config, filter, before, limit))
        return (build() for build in found)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync `aput`."""
        return self._block(self._log.put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync `aput_writes`."""
        self._block(self._log.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Sync `adelete_thread`."""
        self._block(_prune.delete_thread(self._log, thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync `adelete_for_runs`."""
        self._block(_prune.delete_for_runs(self._log, run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync `acopy_thread`."""
        self._block(_prune.copy_thread(self._log, source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync `aprune`."""
        self._block(_prune.prune(self._log, thread_ids, strategy))

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> StatekeeperSaver:
        """A clone whose serializer allows more msgpack types (LangGraph's strict mode);
        it shares this saver's store and caches."""
        clone = super().with_allowlist(extra_allowlist)
        if clone is self or not isinstance(clone, StatekeeperSaver):
            return self
        clone._log = self._log.with_codec(ValueCodec(clone.serde))
        return clone

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A zero-padded counter plus a random fraction, so forked branches never collide."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:016}.{random.getrandbits(32):08x}"
