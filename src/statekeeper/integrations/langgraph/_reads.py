"""Reading checkpoints back: one, or a listing (layout: `_layout`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from statekeeper.errors import NotFoundError, StoreCorruptError
from statekeeper.integrations.langgraph._layout import (
    CHECKPOINT,
    Reader,
    checkpoint_entry_id,
    key,
    matches,
    session_id,
    thread_of,
    writes_by_checkpoint,
)
from statekeeper.integrations.langgraph._spine import TAIL, Tip
from statekeeper.stores.types import Entry, EntryKind

if TYPE_CHECKING:
    from statekeeper.integrations.langgraph._ops import CheckpointLog

_log = logging.getLogger(__name__)
_WINDOW = 3 * TAIL + 16  # the log's last entries a saver new to a thread reads first


async def get_tuple(log: CheckpointLog, config: RunnableConfig) -> CheckpointTuple | None:
    """The checkpoint a config names (its namespace's latest if none), or None."""
    thread_id, ns = thread_of(config)
    sid = session_id(thread_id, ns)
    cid = (config.get("configurable") or {}).get("checkpoint_id")
    reader = Reader(log.codec)
    read_from: int | None = None  # the seq after which the reader holds every entry
    try:
        if cid is None:
            record = await log.store.get_session(log.tenant, sid)
            cid = record.state.get("latest")
            if not isinstance(cid, str):
                return None
            if sid not in log.tips:
                # A saver new to the thread: its latest checkpoint, the blobs and writes
                # around it and the chain they extend are most likely in the log's last
                # entries (a step adds three): one read instead of four.
                read_from = max(0, record.last_seq - _WINDOW)
                reader.add(await log.store.read_entries(log.tenant, sid, after_seq=read_from))
        entry = reader.entries.get(checkpoint_entry_id(cid)) or await log.store.get_entry(
            log.tenant, sid, checkpoint_entry_id(cid)
        )
        if read_from is None or entry.seq <= read_from:
            read_from = entry.seq
            reader.add(await log.store.read_entries(log.tenant, sid, after_seq=entry.seq))
    except NotFoundError:
        return None
    if entry.kind != CHECKPOINT:
        raise StoreCorruptError(
            f"checkpoint {cid!r} of thread {thread_id!r} cannot be read: "
            f"{entry.payload.get('error', entry.kind)}"
        )
    reader.add([entry])
    after = [e for s, e in sorted(reader.by_seq.items()) if s > entry.seq]
    await _load_values(log, reader, sid, entry, read_from)
    found = reader.to_tuple(thread_id, ns, entry, writes_by_checkpoint(after).get(key(cid), []))
    if cid > log.newest.get(sid, ""):
        log.newest[sid] = cid
    _remember_read(log, sid, entry, reader)
    return found


async def _load_values(
    log: CheckpointLog, reader: Reader, sid: str, entry: Entry, read_from: int
) -> None:
    """Read the checkpoint's blobs, each delta chain in one range read (unless the reader
    holds every entry after ``read_from`` already), then the segments the chains rest on.
    A list this saver wrote or read last (a tip) is not read again: blobs never change."""
    tips = log.tips.get(sid, {})
    wanted = []
    for channel, blob_id in entry.payload["values"].items():
        tip = tips.get(channel)
        if tip is not None and tip.blob_id == blob_id:
            reader.values[blob_id] = list(tip.items)
        elif blob_id not in reader.entries:
            wanted.append(blob_id)
    reader.add(await _entries(log, sid, wanted))
    chained = [
        b
        for b in reader_blobs(reader, entry)
        if reader.chain_start(b) is not None and b.id not in reader.values
    ]
    low = min((int(b.payload["root"]) for b in chained), default=read_from + 1)
    if low <= read_from:
        high = min(max(b.seq for b in chained), read_from)
        reader.add(await log.store.read_entries(log.tenant, sid, after_seq=low - 1, until_seq=high))
    unbuilt = [b.id for b in reader_blobs(reader, entry) if b.id not in reader.values]
    reader.add(await _entries(log, sid, reader.segments_missing(unbuilt)))


async def _entries(log: CheckpointLog, sid: str, entry_ids: list[str]) -> list[Entry]:
    """The entries with these ids, read together; a missing one is left out (and
    reported by `Reader.value`, naming it)."""

    async def one(entry_id: str) -> Entry | None:
        try:
            return await log.store.get_entry(log.tenant, sid, entry_id)
        except NotFoundError:
            return None

    found = await asyncio.gather(*(one(i) for i in entry_ids))
    return [e for e in found if e is not None]


def _remember_read(log: CheckpointLog, sid: str, entry: Entry, reader: Reader) -> None:
    """A value read can be the base of the next delta (a resume in a new process)."""
    tips = log.tips_of(sid)
    for channel, blob_id in entry.payload["values"].items():
        if channel in tips or blob_id not in reader.entries:
            continue
        value = reader.value(blob_id)  # built already: a copy of the prefix
        if type(value) is list:
            blob = reader.entries[blob_id]
            root = blob.payload.get("root", blob.seq)
            segs, parts = reader.tail(blob_id)
            tips[channel] = Tip(blob_id, blob.seq, root, value, blob.payload, segs, parts)


async def list_checkpoints(
    log: CheckpointLog,
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> list[Callable[[], CheckpointTuple]]:
    """Checkpoints newest first (one read per session; each built when called); an
    unreadable row is logged."""
    configurable = (config or {}).get("configurable") or {}
    wanted_id = configurable.get("checkpoint_id")
    before_id = ((before or {}).get("configurable") or {}).get("checkpoint_id")
    found: list[tuple[str, str, str, Entry, Reader, list[Entry]]] = []
    for thread_id, ns, sid in await _threads(log, config):
        try:
            entries = await log.store.read_entries(log.tenant, sid)
        except NotFoundError:
            continue
        reader = Reader(log.codec)
        reader.add(entries)
        writes = writes_by_checkpoint(entries)
        for entry in entries:
            if entry.kind == EntryKind.CORRUPT:
                # Reported, and the valid rest still listed (the row is left for repair).
                _log.warning(
                    "LangGraph thread %r: entry %s (seq %d) cannot be read: %s",
                    thread_id,
                    entry.id,
                    entry.seq,
                    entry.payload.get("error"),
                )
                continue
            cid = entry.payload.get("id") if entry.kind == CHECKPOINT else None
            if cid is None or (wanted_id is not None and cid != wanted_id):
                continue
            if before_id is not None and cid >= before_id:
                continue
            if matches(log.codec.decode(entry.payload["metadata"]), filter):
                found.append((cid, thread_id, ns, entry, reader, writes.get(key(cid), [])))
    found.sort(key=lambda f: f[0], reverse=True)
    if limit is not None:
        found = found[:limit]
    # Built one by one as the caller iterates: a long history is never all in memory.
    return [partial(r.to_tuple, t, ns, e, w) for _, t, ns, e, r, w in found]


async def _threads(log: CheckpointLog, config: RunnableConfig | None) -> list[tuple[str, str, str]]:
    """(thread, namespace, session) of every session a config names."""
    if config is not None:
        thread_id, ns = thread_of(config)
        if config["configurable"].get("checkpoint_ns") is not None:
            return [(thread_id, ns, session_id(thread_id, ns))]
        return await log.sessions(thread_id)
    return await log.sessions(None)


def reader_blobs(reader: Reader, entry: Entry) -> list[Entry]:
    """The blob entries a checkpoint entry names that the reader holds."""
    return [reader.entries[b] for b in entry.payload["values"].values() if b in reader.entries]
