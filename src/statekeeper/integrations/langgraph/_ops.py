"""The checkpointer's operations, async, on a statekeeper store (layout: `_layout`)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)
from pydantic import JsonValue

from statekeeper.errors import AlreadyExistsError, ConflictError, NotFoundError
from statekeeper.integrations.langgraph._layout import (
    AGENT_ID,
    BLOB,
    CHECKPOINT,
    NS_KEY,
    RUNS_NAMESPACE,
    THREAD_KEY,
    WRITE,
    blob_entry_id,
    checkpoint_entry_id,
    run_key,
    session_id,
    thread_of,
    write_entry_id,
)
from statekeeper.integrations.langgraph._spine import (
    SEGMENT_BYTES,
    Planned,
    Tip,
    is_segment,
    plan,
)
from statekeeper.integrations.langgraph._values import ValueCodec
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES
from statekeeper.stores.base import Store
from statekeeper.stores.types import Entry, EntryDraft, SessionPatch, SessionQuery, SessionRecord

_WAIT_FOR_PUT = 30.0  # seconds writes wait for their checkpoint's put before going first
_TIP_SESSIONS = 256  # threads whose list tips stay in memory (the bases of deltas)
_INDEXED_RUNS = 4096  # (run, thread) pairs remembered as already in the run index


class CheckpointLog:
    """LangGraph checkpoints, values and writes in a store, for one tenant."""

    def __init__(self, store: Store, tenant: str, codec: ValueCodec) -> None:
        self.store, self.tenant, self.codec = store, tenant, codec
        limit = getattr(store, "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES)
        self.segment_cap = min(SEGMENT_BYTES, int(limit) // 4)
        self.tips: OrderedDict[str, dict[str, Tip]] = OrderedDict()
        self._parents: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {}
        self._known: set[str] = set()
        self._indexed: set[str] = set()
        # LangGraph may send a checkpoint's writes before (or while) it stores the
        # checkpoint; they wait for it, so a checkpoint's writes always follow it in the log
        # and a read finds them after it. ``_newest``: the newest checkpoint id put or read.
        self._storing: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.newest: dict[str, str] = {}
        # The newest checkpoint's writes per session: (checkpoint id, channel -> [(entry
        # seq, stored value)]), so the next delta can name a write instead of copying it.
        self._written: dict[str, tuple[str, dict[str, list[tuple[int, Any]]]]] = {}
        self._writing: dict[tuple[str, str], set[asyncio.Future[None]]] = {}

    def with_codec(self, codec: ValueCodec) -> CheckpointLog:
        """The same log (store, tenant, caches) read and written with another codec."""
        clone = copy.copy(self)
        clone.codec = codec
        return clone

    # -- writing -------------------------------------------------------------------------

    async def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns = thread_of(config)
        cid = checkpoint["id"]
        done = self._announce(session_id(thread_id, ns), cid)
        try:
            return await self._put(config, checkpoint, metadata, new_versions)
        except BaseException:
            # The run stops: writes waiting for later checkpoints of it go ahead.
            self.newest.pop(session_id(thread_id, ns), None)
            for (waiting_sid, _), waiting in list(self._storing.items()):
                if waiting_sid == session_id(thread_id, ns) and not waiting.done():
                    waiting.set_result(None)
            raise
        finally:
            self._storing.pop((session_id(thread_id, ns), cid), None)
            if not done.done():
                done.set_result(None)

    def _announce(self, sid: str, cid: str) -> asyncio.Future[None]:
        """Register a checkpoint being stored (before any await, so writes can wait)."""
        done = self._storing.get((sid, cid))
        if done is None:
            done = self._storing[(sid, cid)] = asyncio.get_running_loop().create_future()
        if cid > self.newest.get(sid, ""):
            self.newest[sid] = cid
        return done

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns = thread_of(config)
        parent_id = (config.get("configurable") or {}).get("checkpoint_id")
        sid = await self.ensure(thread_id, ns)
        meta = dict(get_serializable_checkpoint_metadata(config, metadata))
        run_id = meta.get("run_id")
        if run_id is not None:
            await self.index_run(str(run_id), sid, thread_id, ns)
        cid = checkpoint["id"]
        versions = checkpoint["channel_versions"]
        if parent_id is not None and (sid, parent_id) in self._writing:
            # The parent's writes are being stored: wait, so a delta can name them.
            await asyncio.wait(list(self._writing[(sid, parent_id)]))
        drafts, values, planned = await self._blobs(sid, checkpoint, parent_id, new_versions)
        rest = {k: v for k, v in checkpoint.items() if k not in ("channel_values", "id")}
        doc = {
            "id": cid,
            "checkpoint": self.codec.encode(rest),
            "metadata": self.codec.encode(meta),
            "values": values,
        }
        if parent_id is not None:
            doc["parent"] = parent_id
        if run_id is not None:
            doc["run"] = str(run_id)
        drafts.append(_side(checkpoint_entry_id(cid), CHECKPOINT, doc))
        patch = SessionPatch(set={"state": {"latest": cid}})
        stored = await self._append(sid, thread_id, ns, drafts, patch)
        self._remember_put(sid, stored, checkpoint, planned)
        self._parents[sid] = (cid, dict(versions), values)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}

    async def _blobs(
        self,
        sid: str,
        checkpoint: Checkpoint,
        parent_id: str | None,
        new_versions: ChannelVersions,
    ) -> tuple[list[EntryDraft], dict[str, str], dict[str, Planned]]:
        """Drafts for the values that changed (and the segments they rest on); the blob id
        of every value; what each list channel's next tip will be."""
        parent_versions, parent_values = await self._parent(sid, parent_id)
        tips = self.tips.get(sid, {})
        cached = self._written.get(sid)
        written = cached[1] if cached is not None and cached[0] == parent_id else {}
        channel_values = checkpoint["channel_values"]
        drafts: list[EntryDraft] = []
        values: dict[str, str] = {}
        planned: dict[str, Planned] = {}
        for channel, version in checkpoint["channel_versions"].items():
            if channel not in channel_values:
                continue
            if (
                channel not in new_versions
                and channel in parent_values
                and parent_versions.get(channel) == version
            ):
                values[channel] = parent_values[channel]
                continue
            blob_id = blob_entry_id(checkpoint["id"], channel)
            tip = tips.get(channel)
            if tip is not None and tip.blob_id == blob_id:  # a retried put
                found = Planned(tip.payload, tip.segs, tip.parts, tip.written)
            else:
                value = channel_values[channel]
                fetch = functools.partial(self._fetch, sid)
                sent = written.get(channel, ())
                found = await plan(
                    self.codec, blob_id, channel, value, tip, sent, fetch, self.segment_cap
                )
            drafts.extend(found.segments)
            drafts.append(_side(blob_id, BLOB, found.payload))
            values[channel] = blob_id
            planned[channel] = found
        return drafts, values, planned

    async def _fetch(self, sid: str, entry_id: str) -> dict[str, Any]:
        return (await self.store.get_entry(self.tenant, sid, entry_id)).payload

    async def _parent(
        self, sid: str, parent_id: str | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The parent checkpoint's channel versions and blob ids (empty if unknown)."""
        if parent_id is None:
            return {}, {}
        cached = self._parents.get(sid)
        if cached is not None and cached[0] == parent_id:
            return cached[1], cached[2]
        try:
            entry = await self.store.get_entry(self.tenant, sid, checkpoint_entry_id(parent_id))
        except NotFoundError:
            return {}, {}
        rest = self.codec.decode(entry.payload["checkpoint"])
        return dict(rest.get("channel_versions") or {}), dict(entry.payload["values"])

    def _remember_put(
        self,
        sid: str,
        stored: list[Entry],
        checkpoint: Checkpoint,
        planned: dict[str, Planned],
    ) -> None:
        """Make the list values just written the bases of the next deltas."""
        tips = self.tips_of(sid)
        for entry in stored:
            if entry.kind != BLOB or is_segment(entry.id):
                continue
            channel = entry.payload["ch"]
            value = checkpoint["channel_values"].get(channel)
            found = planned.get(channel)
            if type(value) is list and found is not None:
                root = entry.payload.get("root", entry.seq)
                tips[channel] = Tip(
                    entry.id,
                    entry.seq,
                    root,
                    list(value),
                    entry.payload,
                    found.segs,
                    found.parts,
                    found.segments,
                )
            else:
                tips.pop(channel, None)

    def tips_of(self, sid: str) -> dict[str, Tip]:
        tips = self.tips.setdefault(sid, {})
        self.tips.move_to_end(sid)
        while len(self.tips) > _TIP_SESSIONS:
            # The least recently used thread's caches go together (memory stays bounded).
            evicted, _ = self.tips.popitem(last=False)
            self._drop_caches(evicted)
        return tips

    async def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        thread_id, ns = thread_of(config)
        cid = config["configurable"]["checkpoint_id"]
        done = asyncio.get_running_loop().create_future()
        writing = self._writing.setdefault((session_id(thread_id, ns), cid), set())
        writing.add(done)
        try:
            await self._put_writes(thread_id, ns, cid, writes, task_id, task_path)
        finally:
            writing.discard(done)
            if not writing:
                self._writing.pop((session_id(thread_id, ns), cid), None)
            done.set_result(None)

    async def _put_writes(
        self,
        thread_id: str,
        ns: str,
        cid: str,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        sid = await self.ensure(thread_id, ns)
        await self._stored(sid, cid)
        drafts = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            doc = {"task": task_id, "idx": idx, "ch": channel, "value": self.codec.encode(value)}
            if task_path:
                doc["path"] = task_path
            entry_id = write_entry_id(cid, task_id, idx)
            if idx < 0:  # a special write replaces the last one: give each its own entry
                entry_id += ":" + _unique()
            drafts.append(_side(entry_id, WRITE, doc))
        if not drafts:
            return
        try:
            stored = await self._append(sid, thread_id, ns, drafts, None)
        except ConflictError:
            # A retried task: the first stored write for a (task, idx) wins, as in LangGraph.
            for draft in drafts:
                try:
                    await self._append(sid, thread_id, ns, [draft], None)
                except ConflictError:
                    continue
            return
        self._note_writes(sid, cid, stored)

    def _note_writes(self, sid: str, cid: str, stored: list[Entry]) -> None:
        cached = self._written.get(sid)
        if cached is None or cached[0] != cid:
            if cached is not None and cid < cached[0]:
                return
            cached = self._written[sid] = (cid, {})
        for entry in stored:
            channel = entry.payload["ch"]
            cached[1].setdefault(channel, []).append((entry.seq, entry.payload["value"]))

    async def _stored(self, sid: str, cid: str) -> None:
        """Wait until this process has stored checkpoint ``cid`` if it is storing it, or
        will (newer than any it put or read); a checkpoint never stored here was stored
        before its writes were made."""
        done = self._storing.get((sid, cid))
        if done is None and sid in self.newest and cid > self.newest[sid]:
            done = self._storing[(sid, cid)] = asyncio.get_running_loop().create_future()
        if done is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(done), _WAIT_FOR_PUT)
        except TimeoutError:
            self._storing.pop((sid, cid), None)

    async def _append(
        self,
        sid: str,
        thread_id: str,
        ns: str,
        drafts: list[EntryDraft],
        patch: SessionPatch | None,
    ) -> list[Entry]:
        """Append, creating the session again if another process deleted it meanwhile."""
        try:
            result = await self.store.append_entries(self.tenant, sid, drafts, patch=patch)
        except NotFoundError:
            self.forget(sid)
            await self.ensure(thread_id, ns)
            result = await self.store.append_entries(self.tenant, sid, drafts, patch=patch)
        return result.entries

    async def ensure(self, thread_id: str, ns: str) -> str:
        sid = session_id(thread_id, ns)
        if sid in self._known:
            return sid
        record = SessionRecord(
            id=sid,
            tenant=self.tenant,
            agent_id=AGENT_ID,
            title=f"LangGraph thread {thread_id}"[:200],
            metadata={THREAD_KEY: thread_id, NS_KEY: ns},
        )
        with contextlib.suppress(AlreadyExistsError):
            await self.store.create_session(record)
        self._known.add(sid)
        return sid

    async def index_run(self, run_id: str, sid: str, thread_id: str, ns: str) -> None:
        marker = run_key(run_id, sid)
        if marker in self._indexed:
            return
        value: dict[str, JsonValue] = {"thread": thread_id, "ns": ns}
        await self.store.put_record(self.tenant, RUNS_NAMESPACE, marker, value)
        if len(self._indexed) >= _INDEXED_RUNS:
            self._indexed.clear()  # a cache: writing a marker again is harmless
        self._indexed.add(marker)

    def forget(self, sid: str) -> None:
        """Drop what this saver remembers of a session (deleted, pruned or copied onto)."""
        self.tips.pop(sid, None)
        self._drop_caches(sid)
        self._indexed = {m for m in self._indexed if not m.endswith("." + sid)}

    def _drop_caches(self, sid: str) -> None:
        self._known.discard(sid)
        self._parents.pop(sid, None)
        self.newest.pop(sid, None)
        self._written.pop(sid, None)

    async def sessions(self, thread_id: str | None) -> list[tuple[str, str, str]]:
        """(thread, namespace, session) of a thread's namespaces (of every thread if None).

        The store's filter narrows the listing; each session is then checked exactly (a
        backend may compare strings loosely, e.g. SQLite's json_extract at a NUL)."""
        metadata = {} if thread_id is None else {THREAD_KEY: thread_id}
        found: list[tuple[str, str, str]] = []
        cursor = None
        while True:
            query = SessionQuery(agent_id=AGENT_ID, metadata=metadata, limit=1000, cursor=cursor)
            page = await self.store.list_sessions(self.tenant, query)
            for record in page.items:
                thread, ns = record.metadata.get(THREAD_KEY), record.metadata.get(NS_KEY)
                if not isinstance(thread, str) or not isinstance(ns, str):
                    continue  # not a session this saver made
                if thread_id not in (None, thread) or record.id != session_id(thread, ns):
                    continue
                found.append((thread, ns, record.id))
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor


def _side(entry_id: str, kind: str, payload: dict[str, Any]) -> EntryDraft:
    return EntryDraft(id=entry_id, kind=kind, payload=payload, parent=None, side=True)


def _unique() -> str:
    from statekeeper.ids import new_id

    return new_id("x")
