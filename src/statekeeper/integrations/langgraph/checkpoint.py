"""`StatekeeperSaver`: a LangGraph checkpointer on any statekeeper store.

    async with open_store("sqlite:///state.db") as store:
        graph = builder.compile(checkpointer=StatekeeperSaver(store))
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t1"}})

or ``with StatekeeperSaver.from_url("sqlite:///state.db") as saver`` (sync or async code;
the saver opens the store and closes it). Lists that grow by appending
(``MessagesState``'s messages) are stored as deltas: a step writes only the messages it
added, once. Values are JSON (LangChain messages as their fields), or LangGraph's
msgpack bytes in base64; pickle is refused. See
docs/integrations/langgraph-checkpointer.md.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterator, Sequence
from typing import Any, Self, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from statekeeper.errors import StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.integrations._owned import AdapterStore, StoreLifecycle
from statekeeper.integrations.langgraph import _prune, _reads
from statekeeper.integrations.langgraph._ops import CheckpointLog
from statekeeper.integrations.langgraph._values import PickleRefusedError, ValueCodec
from statekeeper.loops import background_loop, hand_off, running_loop
from statekeeper.stores import Store

__all__ = ["PickleRefusedError", "StatekeeperSaver"]

T = TypeVar("T")
Op = Callable[[CheckpointLog], Coroutine[Any, Any, T]]


class _LogCell:
    """The checkpoint log of a saver and its clones (`with_allowlist`), made once."""

    def __init__(self, log: CheckpointLog | None) -> None:
        self.log = log


class StatekeeperSaver(StoreLifecycle, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer (sync and async) over a statekeeper `Store`.

    A saver runs its calls on one event loop, its *loop*: the loop it was made in, or
    ``loop=``, or statekeeper's background loop (when made outside a running loop, and
    always for a store it opened itself with `from_url`). Calls from other threads and
    loops are handed to it; once it has closed or stopped running, the saver moves to
    the background loop for good. Its sync methods may be called from any thread but its
    loop's own (which they would block: use the async methods there).

    ``tenant`` scopes every thread it reads or writes. ``serde`` must not fall back to
    pickle (`PickleRefusedError`). A store passed in stays the caller's; one opened by
    `from_url` is the saver's (`close`, `aclose`, ``with``, ``async with``).
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
        codec = ValueCodec(self.serde)
        stores = AdapterStore.given(store, "StatekeeperSaver")
        loop = loop or running_loop() or background_loop()
        self._setup(tenant, stores, loop, codec, CheckpointLog(store, tenant, codec))

    def _setup(
        self,
        tenant: str,
        stores: AdapterStore,
        loop: asyncio.AbstractEventLoop,
        codec: ValueCodec,
        log: CheckpointLog | None,
    ) -> None:
        self.tenant = tenant
        self._stores = stores
        self._loop = loop
        self._codec = codec
        self._cell = _LogCell(log)
        self._log = log

    # -- making one ----------------------------------------------------------------------

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        tenant: str = "default",
        serde: SerializerProtocol | None = None,
        **options: Any,
    ) -> Self:
        """A saver over a store of its own, opened from ``url`` (``options`` go to
        `open_store`), which `close` closes (as leaving ``with`` or ``async with`` does).

        Usable in synchronous code and inside a running event loop, which it does not
        block: the store opens on statekeeper's background loop, where the saver's calls
        run. Entering ``with`` in synchronous code (or ``async with``) waits for the open,
        so a store that cannot open fails there; otherwise the first call raises it.
        """
        saver = cls.__new__(cls)
        BaseCheckpointSaver.__init__(saver, serde=serde)
        validate_id(tenant, "tenant")
        codec = ValueCodec(saver.serde)
        stores = AdapterStore.open(url, options, "StatekeeperSaver")
        saver._setup(tenant, stores, background_loop(), codec, None)
        return saver

    @classmethod
    def afrom_url(
        cls,
        url: str,
        *,
        tenant: str = "default",
        serde: SerializerProtocol | None = None,
        **options: Any,
    ) -> Self:
        """`from_url` under the name LangGraph's async savers use:
        ``async with StatekeeperSaver.afrom_url(url) as saver``."""
        return cls.from_url(url, tenant=tenant, serde=serde, **options)

    @property
    def store(self) -> Store:
        """The statekeeper store checkpoints live in."""
        return self._stores.store()

    # -- running on the saver's loop -----------------------------------------------------

    def _home(self) -> asyncio.AbstractEventLoop:
        """The saver's loop; the background loop from now on once it stopped or closed
        (a call handed to a loop that does not run would wait forever)."""
        loop = self._loop
        if loop.is_closed() or not loop.is_running():
            self._loop = loop = background_loop()
        return loop

    def _the_log(self) -> CheckpointLog:
        # On the saver's loop, in a call: an owned store has opened by now.
        if self._log is None:
            if self._cell.log is None:
                self._cell.log = CheckpointLog(self._stores.store(), self.tenant, self._codec)
            log = self._cell.log
            self._log = log if log.codec is self._codec else log.with_codec(self._codec)
        return self._log

    async def _call(self, op: Op[T]) -> T:
        return await self._stores.call(lambda: op(self._the_log()))

    async def _on_loop(self, op: Op[T]) -> T:
        self._stores.check_open()
        loop = self._home()
        if asyncio.get_running_loop() is loop:
            return await self._call(op)
        return await hand_off(self._call(op), loop)

    def _block(self, op: Op[T]) -> T:
        self._stores.check_open()
        loop = self._home()
        if running_loop() is loop:
            raise StatekeeperError(
                "a sync StatekeeperSaver method was called on the event loop it runs its "
                "calls on, which it would block; use the async method (aget_tuple, aput, "
                "...) or graph.ainvoke there"
            )
        return asyncio.run_coroutine_threadsafe(self._call(op), loop).result()

    # -- async API -----------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint a config names (its latest if it names none), or None."""
        return await self._on_loop(lambda log: _reads.get_tuple(log, config))

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
            lambda log: _reads.list_checkpoints(log, config, filter, before, limit)
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
        return await self._on_loop(lambda log: log.put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes; the first write of a (task, index) wins."""
        await self._on_loop(lambda log: log.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and writes in every namespace."""
        await self._on_loop(lambda log: _prune.delete_thread(log, thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) the given runs made."""
        await self._on_loop(lambda log: _prune.delete_for_runs(log, run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another thread."""
        await self._on_loop(lambda log: _prune.copy_thread(log, source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's latest checkpoint (and the values it
        needs); ``delete``: delete the threads."""
        await self._on_loop(lambda log: _prune.prune(log, thread_ids, strategy))

    # -- sync API ------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync `aget_tuple`."""
        return self._block(lambda log: _reads.get_tuple(log, config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync `alist`."""
        found = self._block(lambda log: _reads.list_checkpoints(log, config, filter, before, limit))
        return (build() for build in found)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync `aput`."""
        return self._block(lambda log: log.put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync `aput_writes`."""
        self._block(lambda log: log.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Sync `adelete_thread`."""
        self._block(lambda log: _prune.delete_thread(log, thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync `adelete_for_runs`."""
        self._block(lambda log: _prune.delete_for_runs(log, run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync `acopy_thread`."""
        self._block(lambda log: _prune.copy_thread(log, source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync `aprune`."""
        self._block(lambda log: _prune.prune(log, thread_ids, strategy))

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> StatekeeperSaver:
        """A clone whose serializer allows more msgpack types (LangGraph's strict mode);
        it shares this saver's store and caches (and closing either closes a store the
        saver opened)."""
        clone = super().with_allowlist(extra_allowlist)
        if clone is self or not isinstance(clone, StatekeeperSaver):
            return self
        clone._codec = ValueCodec(clone.serde)
        clone._log = None  # made from the shared cell, with the clone's codec
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
